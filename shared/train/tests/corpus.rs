//! Corpus prompts: held-out files never reach the training split, HTML loses its markup.

use std::path::Path;

use tandem_train::corpus::{is_held_out, prompts, strip_html, CorpusConfig};

#[test]
fn held_out_files_never_train() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..40u8 {
        let name = dir.path().join(format!("doc{i}.txt"));
        std::fs::write(&name, vec![b'0' + i; 64]).expect("write");
    }
    std::fs::write(dir.path().join("skip.bin"), [0u8; 64]).expect("write");
    let cfg = CorpusConfig {
        prompt_tokens: 9,
        bos: Some(2),
        train_prompts: 1000,
        held_out_prompts: 1000,
        held_out_percent: 25,
        prompts_per_file: 3,
        seed: 1,
    };
    let encode = |t: &str| Ok::<_, String>(t.bytes().map(u32::from).collect());
    let p = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect("prompts");
    assert!(!p.train.is_empty() && !p.held_out.is_empty());
    let file_of = |prompt: &Vec<u32>| {
        assert_eq!(prompt.len(), 9);
        assert_eq!(prompt[0], 2);
        dir.path()
            .join(format!("doc{}.txt", prompt[1] - u32::from(b'0')))
    };
    for q in &p.train {
        assert!(!is_held_out(&file_of(q), 25));
    }
    for q in &p.held_out {
        assert!(is_held_out(&file_of(q), 25));
    }
    assert_eq!(p.train.len() + p.held_out.len(), 40 * 3);
    assert!(!p.train.iter().any(|q| q.contains(&0)), "skip.bin was read");
    assert!(is_held_out(Path::new("a"), 100) && !is_held_out(Path::new("a"), 0));
}

#[test]
fn html_loses_tags_scripts_and_entities() {
    let html = "<html><head><style>p{}</style><script>var x=1;</script></head>\
                <body><p>a &lt;b&gt; &amp; c</p>\n\n\n\n<div>d</div></body></html>";
    assert_eq!(strip_html(html), "a <b> & c\n\nd\n");
}
