use proptest::prelude::*;

use super::*;

fn classes(a: Vec<Vec<u32>>, b: Vec<Vec<u32>>) -> Vec<(String, Vec<Vec<u32>>)> {
    vec![("a".into(), a), ("b".into(), b)]
}

/// A router over classes a and b, reading prompts of any length.
fn ab(ids: Vec<u32>, log_probs: Vec<Vec<f32>>, unseen: [f32; 2], bias: [f32; 2]) -> TokenRouter {
    TokenRouter {
        classes: vec!["a".into(), "b".into()],
        ids,
        log_probs,
        unseen: unseen.to_vec(),
        bias: bias.to_vec(),
        min_tokens: 1,
        max_tokens: None,
    }
}

#[test]
fn fit_gives_the_smoothed_log_probabilities() {
    // Class a: 1 1 1 2 (4 tokens); class b: 2 2 3 (3 tokens). min_count 2 keeps 1 and 2
    // (3 occurs once and joins the unseen bucket): 3 symbols.
    let cfg = FitConfig {
        alpha: 1.0,
        min_count: 2,
    };
    let r = TokenRouter::fit(&classes(vec![vec![1, 1, 1, 2]], vec![vec![2, 2, 3]]), cfg)
        .expect("valid");
    assert_eq!(r.ids, vec![1, 2]);
    let ln = |x: f64| x.ln() as f32;
    assert_eq!(r.log_probs[0], vec![ln(4.0 / 7.0), ln(2.0 / 7.0)]);
    assert_eq!(r.unseen[0], ln(1.0 / 7.0));
    assert_eq!(r.log_probs[1], vec![ln(1.0 / 6.0), ln(3.0 / 6.0)]);
    assert_eq!(r.unseen[1], ln(2.0 / 6.0));
    assert_eq!(r.bias, vec![0.0, 0.0]);
    r.check().expect("valid");
}

#[test]
fn scores_are_bias_plus_mean_log_probability() {
    let r = ab(
        vec![5, 9],
        vec![vec![-1.0, -3.0], vec![-2.0, -0.5]],
        [-10.0, -4.0],
        [0.25, 0.0],
    );
    let s = r.scores(&[5, 9, 7]);
    assert!((s[0] - ((-1.0 - 3.0 - 10.0) / 3.0 + 0.25)).abs() < 1e-12);
    assert!((s[1] - (-2.0 - 0.5 - 4.0) / 3.0).abs() < 1e-12);
    assert_eq!(r.route(&[5, 5]), Some(0));
    assert_eq!(r.route(&[9]), Some(1));
    assert_eq!(r.route(&[]), None, "no tokens, no route");
    let r = TokenRouter { min_tokens: 3, ..r };
    assert_eq!(r.route(&[5, 5]), None, "too short to route");
    assert_eq!(r.route(&[5, 5, 5]), Some(0));
    // Cut to one token, [9, 5, 5] reads as class b, whole as class a.
    let held = vec![vec![vec![9, 5, 5]], vec![vec![9, 9, 9]]];
    assert_eq!(r.accuracy_at(&held, 1), 0.5);
    assert_eq!(r.accuracy_at(&held, 3), 1.0);
    // Read up to three tokens, [5, 5, 5, 9, 9, 9, 9] is class a.
    let r = TokenRouter {
        max_tokens: Some(3),
        ..r
    };
    assert_eq!(r.route(&[5, 5, 5, 9, 9, 9, 9]), Some(0));
    assert_eq!(
        TokenRouter {
            max_tokens: None,
            ..r.clone()
        }
        .route(&[5, 5, 5, 9, 9, 9, 9]),
        Some(1)
    );
    assert!(
        TokenRouter {
            max_tokens: Some(2),
            ..r
        }
        .check()
        .is_err(),
        "reads fewer than it routes"
    );
}

#[test]
fn check_refuses_what_a_file_may_break() {
    let good = TokenRouter::fit(
        &classes(vec![vec![1, 2, 2]], vec![vec![3, 3, 1]]),
        FitConfig::default(),
    )
    .expect("valid");
    good.check().expect("valid");
    let refused = |what: &str, change: &dyn Fn(&mut TokenRouter)| {
        let mut r = good.clone();
        r.ids = vec![1, 2];
        r.log_probs = vec![vec![-1.0, -1.0], vec![-1.0, -1.0]];
        change(&mut r);
        assert!(r.check().is_err(), "{what} passed the check");
    };
    refused("one class", &|r| r.classes.truncate(1));
    refused("short row", &|r| r.log_probs[1].push(0.0));
    refused("unsorted", &|r| r.ids = vec![2, 1]);
    refused("nan", &|r| r.bias[0] = f32::NAN);
    refused("missing bias", &|r| r.bias.truncate(1));
}

#[test]
fn fit_refuses_a_single_or_empty_class() {
    let one = vec![("a".to_string(), vec![vec![1u32, 2]])];
    assert!(TokenRouter::fit(&one, FitConfig::default()).is_err());
    let empty = classes(vec![vec![1, 2]], vec![vec![]]);
    assert!(TokenRouter::fit(&empty, FitConfig::default()).is_err());
}

/// Texts of two classes that share a common core of ids and differ in a marker id each
/// class uses at its own rate.
fn texts(rng: &mut rand_chacha::ChaCha8Rng, marker: u32, rate: f64, n: usize) -> Vec<Vec<u32>> {
    use rand::Rng;
    (0..n)
        .map(|_| {
            (0..32)
                .map(|_| match rng.random_bool(rate) {
                    true => marker,
                    false => rng.random_range(0..50),
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_fitted_router_separates_its_classes() {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let train = classes(
        texts(&mut rng, 100, 0.2, 200),
        texts(&mut rng, 200, 0.2, 200),
    );
    let r = TokenRouter::fit(&train, FitConfig::default()).expect("valid");
    let held = vec![
        texts(&mut rng, 100, 0.2, 100),
        texts(&mut rng, 200, 0.2, 100),
    ];
    assert!(r.balanced_accuracy(&held) > 0.99);
}

#[test]
fn the_tuned_bias_sits_midway_between_the_classes_margins() {
    // Margins (score a − score b) of a text with k twos among four tokens: k/4 − 1/2.
    let mut r = ab(
        vec![1, 2],
        vec![vec![-2.0, -1.0], vec![-1.5, -1.5]],
        [-9.0, -9.0],
        [0.0, 0.0],
    );
    // Class a's texts (margin −1/4) fall to b untuned, beside b's own (margin −1/2).
    let held = vec![vec![vec![1, 1, 1, 2]; 3], vec![vec![1, 1, 1, 1]; 5]];
    assert_eq!(r.balanced_accuracy(&held), 0.5);
    assert_eq!((r.recall(&held[0], 0), r.recall(&held[1], 1)), (0.0, 1.0));
    assert_eq!(r.tune_first_bias(&held).expect("valid"), 1.0);
    assert_eq!((r.recall(&held[0], 0), r.recall(&held[1], 1)), (1.0, 1.0));
    assert!(r.check_classes(&["a", "b"]).is_ok());
    assert!(r.check_classes(&["b", "a"]).is_err() && r.check_classes(&["a"]).is_err());
    assert_eq!(r.bias, vec![0.375, 0.0]);
}

proptest! {
    #[test]
    fn routes_are_in_range_and_tuning_never_loses(
        a in prop::collection::vec(prop::collection::vec(0u32..20, 1..12), 1..8),
        b in prop::collection::vec(prop::collection::vec(10u32..30, 1..12), 1..8),
        probe in prop::collection::vec(0u32..40, 0..16),
    ) {
        let mut r = TokenRouter::fit(&classes(a.clone(), b.clone()), FitConfig {
            alpha: 0.5,
            min_count: 1,
        }).expect("valid");
        r.check().expect("valid");
        let route = r.route(&probe);
        prop_assert_eq!(route.is_none(), probe.is_empty());
        prop_assert!(route.is_none_or(|c| c < 2));
        let held = vec![a, b];
        let before = r.balanced_accuracy(&held);
        let after = r.tune_first_bias(&held).expect("valid");
        prop_assert!(after + 1e-12 >= before);
        r.check().expect("valid");
    }
}
