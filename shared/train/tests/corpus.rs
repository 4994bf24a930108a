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
        weights: Vec::new(),
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

/// A benchmark asks for held-out prompts alone: a corpus whose every file is held out gives
/// them, where asking for training prompts too is an error.
#[test]
fn held_out_prompts_alone_need_no_training_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..4u8 {
        std::fs::write(dir.path().join(format!("d{i}.txt")), vec![b'a' + i; 32]).expect("write");
    }
    let mut cfg = CorpusConfig {
        prompt_tokens: 9,
        bos: Some(2),
        train_prompts: 0,
        held_out_prompts: 3,
        held_out_percent: 100,
        prompts_per_file: 1,
        weights: Vec::new(),
        seed: 1,
    };
    let encode = |t: &str| Ok::<_, String>(t.bytes().map(u32::from).collect());
    let p = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect("prompts");
    assert_eq!((p.train.len(), p.held_out.len()), (0, 3));
    cfg.train_prompts = 1;
    let e = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect_err("no training file");
    assert!(e.to_string().contains("no training prompt"), "{e}");
}

#[test]
fn html_loses_tags_scripts_and_entities() {
    let html = "<html><head><style>p{}</style><script>var x=1;</script></head>\
                <body><p>a &lt;b&gt; &amp; c</p>\n\n\n\n<div>d</div></body></html>";
    assert_eq!(strip_html(html), "a <b> & c\n\nd\n");
}

/// A `.jsonl` line is one whole prompt: BOS, then the end of its text (the start cut when
/// it is too long); lines split by `path#line`, so a held-out line never trains; a bad
/// line is an error naming its file and line.
#[test]
fn jsonl_lines_are_whole_prompts_split_by_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lines: Vec<String> = (0..60)
        .map(|i| {
            format!(
                "{{\"text\": \"{}\"}}",
                "q".repeat(i % 12 + 1) + &i.to_string()
            )
        })
        .collect();
    let file = dir.path().join("asks.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n\n").expect("write");
    let cfg = CorpusConfig {
        prompt_tokens: 8,
        bos: Some(2),
        train_prompts: 1000,
        held_out_prompts: 1000,
        held_out_percent: 30,
        prompts_per_file: 4,
        weights: Vec::new(),
        seed: 3,
    };
    let encode = |t: &str| Ok::<_, String>(t.bytes().map(u32::from).collect());
    let p = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect("prompts");
    assert_eq!(p.train.len() + p.held_out.len(), 60, "one prompt per line");
    let line_of = |prompt: &Vec<u32>| -> usize {
        assert_eq!(prompt[0], 2);
        assert!(prompt.len() <= 8);
        let tail: String = prompt[1..].iter().map(|b| char::from(*b as u8)).collect();
        let digits: String = tail.chars().filter(char::is_ascii_digit).collect();
        let i: usize = digits.parse().expect("line number at the end");
        let text = "q".repeat(i % 12 + 1) + &i.to_string();
        assert!(text.ends_with(&tail), "{tail} is not the end of line {i}");
        assert_eq!(prompt.len(), 8.min(text.len() + 1));
        i
    };
    let held = |i: usize| is_held_out(Path::new(&format!("{}#{i}", file.display())), 30);
    assert!(p.train.iter().all(|q| !held(line_of(q))));
    assert!(p.held_out.iter().all(|q| held(line_of(q))));
    assert!(!p.train.is_empty() && !p.held_out.is_empty());

    std::fs::write(&file, "{\"text\": \"fine\"}\n{\"txt\": 1}\n").expect("write");
    let err = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect_err("bad line");
    assert!(err.to_string().contains("asks.jsonl:2"), "{err}");
}

#[test]
fn a_weighted_folder_gives_more_prompts_per_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in ["docs", "prose"] {
        std::fs::create_dir(dir.path().join(kind)).expect("mkdir");
        for i in 0..10u8 {
            let name = dir.path().join(kind).join(format!("{i}.txt"));
            std::fs::write(&name, vec![b'a' + i; 80]).expect("write");
        }
    }
    let docs = dir.path().join("docs");
    let cfg = CorpusConfig {
        prompt_tokens: 9,
        bos: Some(2),
        train_prompts: 1000,
        held_out_prompts: 0,
        held_out_percent: 0,
        prompts_per_file: 2,
        weights: vec![(docs.clone(), 3.0)],
        seed: 4,
    };
    assert_eq!(cfg.room(&docs.join("1.txt")), 6);
    assert_eq!(cfg.room(&dir.path().join("prose/1.txt")), 2);
    let encode = |t: &str| Ok::<_, String>(t.bytes().map(u32::from).collect());
    let p = prompts(&[dir.path().to_path_buf()], &cfg, encode).expect("prompts");
    // Ten files of each kind, every file long enough for ten prompts: 6 per docs file, 2
    // per prose file. Both kinds write the same bytes; the count tells them apart.
    assert_eq!(p.train.len(), 10 * 6 + 10 * 2);
    let unweighted = CorpusConfig {
        weights: Vec::new(),
        ..cfg
    };
    let q = prompts(&[dir.path().to_path_buf()], &unweighted, encode).expect("prompts");
    assert_eq!(q.train.len(), 20 * 2);
}
