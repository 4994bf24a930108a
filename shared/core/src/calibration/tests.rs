//! Calibration on synthetic rounds whose true acceptance curve is known.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// `n` observations with confidences spread over (0, 1) and acceptance drawn with
/// probability `truth(confidence)`.
fn rounds(n: usize, seed: u64, truth: impl Fn(f64) -> f64) -> Vec<Observation> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let c: f64 = rng.random_range(0.02..0.98);
            Observation {
                confidence: c as f32,
                accepted: rng.random::<f64>() < truth(c),
            }
        })
        .collect()
}

fn ece_of(obs: &[Observation], map: Option<&PositionMap>) -> f64 {
    let pairs = obs.iter().map(|o| {
        let c = map.map_or(o.confidence, |m| m.apply(o.confidence));
        (c, o.accepted)
    });
    ece(pairs, 10)
}

#[test]
fn temperature_scaling_recovers_an_overconfident_drafter() {
    let truth = |c: f64| sigmoid(logit(c) / 2.5);
    let (fit, held) = (rounds(4000, 1, truth), rounds(4000, 2, truth));
    let PositionMap::Temperature { temperature } = fit_temperature(&fit) else {
        panic!("not a temperature");
    };
    assert!((temperature - 2.5).abs() < 0.25, "T {temperature}");
    let map = fit_position(&fit);
    let (before, after) = (ece_of(&held, None), ece_of(&held, Some(&map)));
    assert!(before > 0.08, "the raw confidences are off: {before}");
    assert!(after < 0.03 && after < before / 3.0, "{before} → {after}");
}

#[test]
fn isotonic_wins_where_temperature_cannot_fit() {
    let truth = |c: f64| 0.1 + 0.5 * c;
    let (fit, held) = (rounds(4000, 3, truth), rounds(4000, 4, truth));
    let map = fit_position(&fit);
    assert!(matches!(map, PositionMap::Isotonic { .. }), "{map:?}");
    let after = ece_of(&held, Some(&map));
    assert!(after < 0.04 && after < ece_of(&held, None) / 2.0, "{after}");
    assert!((map.apply(0.5) - 0.35).abs() < 0.05, "{}", map.apply(0.5));
}

#[test]
fn a_constant_confidence_becomes_the_measured_acceptance_rate() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let obs: Vec<Observation> = (0..2000)
        .map(|_| Observation {
            confidence: 0.8,
            accepted: rng.random::<f64>() < 0.45,
        })
        .collect();
    let map = fit_position(&obs);
    assert!((map.apply(0.8) - 0.45).abs() < 0.03, "{map:?}");
}

#[test]
fn pool_adjacent_violators_pools_what_decreases() {
    let obs = [(0.1, true), (0.2, false), (0.3, true), (0.4, true)].map(|(c, a)| Observation {
        confidence: c,
        accepted: a,
    });
    let PositionMap::Isotonic { x, y } = fit_isotonic(&obs) else {
        panic!("isotonic");
    };
    assert_eq!(y, vec![0.5, 1.0]);
    assert!(
        (x[0] - 0.15).abs() < 1e-6 && (x[1] - 0.35).abs() < 1e-6,
        "{x:?}"
    );
    let map = PositionMap::Isotonic { x, y };
    assert_eq!(map.apply(0.0), 0.5);
    assert!((map.apply(0.25) - 0.75).abs() < 1e-6);
    assert_eq!(map.apply(0.9), 1.0);
}

#[test]
fn expected_calibration_error_of_known_bins() {
    assert!((ece([(0.9, true), (0.9, false)], 10) - 0.4).abs() < 1e-6);
    assert!(
        ece(
            [(0.25, true), (0.25, false), (0.75, true), (0.75, false)],
            4
        ) - 0.25
            < 1e-6
    );
    assert_eq!(ece([(1.0, true), (0.0, false)], 10), 0.0);
}

fn tempered(t: f64) -> PositionFit {
    PositionFit {
        map: PositionMap::Temperature { temperature: t },
        observations: 100,
    }
}

#[test]
fn regimes_match_greedy_to_greedy_and_sampled_to_the_nearest_temperature() {
    let regime = |temperature: f32, t: f64| Regime {
        temperature,
        sources: vec![SourceFit {
            source: "model".into(),
            positions: vec![tempered(t), tempered(2.0 * t)],
        }],
    };
    let cal = Calibration {
        version: CALIBRATION_VERSION,
        regimes: vec![regime(0.0, 1.0), regime(0.7, 2.0), regime(1.0, 3.0)],
    };
    assert_eq!(cal.regime(0.0).map(|r| r.temperature), Some(0.0));
    assert_eq!(cal.regime(0.6).map(|r| r.temperature), Some(0.7));
    assert_eq!(cal.regime(1.4).map(|r| r.temperature), Some(1.0));
    let r = cal.regime(0.7).expect("sampled");
    let mut conf = [0.9f32, 0.9, 0.9];
    assert!(r.apply(DraftSource::Model, &mut conf));
    let at = |t: f64| sigmoid(logit(0.9f32 as f64) / t) as f32;
    assert_eq!(
        conf,
        [at(2.0), at(4.0), at(4.0)],
        "positions past the end use the last map"
    );
    let mut untouched = [0.9f32];
    assert!(!r.apply(DraftSource::Lookup, &mut untouched));
    assert_eq!(untouched, [0.9]);
    let only_greedy = Calibration {
        version: CALIBRATION_VERSION,
        regimes: vec![regime(0.0, 1.0)],
    };
    assert!(
        only_greedy.regime(0.7).is_none(),
        "greedy maps never serve sampling"
    );
    let json = serde_json::to_string(&cal).expect("json");
    assert_eq!(
        serde_json::from_str::<Calibration>(&json).expect("parse"),
        cal
    );
}

#[test]
fn thin_positions_share_the_map_before_them() {
    let truth = |c: f64| c;
    let by_position = vec![
        rounds(200, 6, truth),
        rounds(200, 7, truth),
        rounds(5, 8, truth),
    ];
    let fit = fit_source(DraftSource::Model, &by_position);
    assert_eq!(fit.source, "model");
    assert_eq!(fit.positions.len(), 3);
    assert_eq!(fit.positions[2].map, fit.positions[1].map);
    assert_eq!(fit.positions[2].observations, 0);
    let none = fit_source(DraftSource::Lookup, &[rounds(3, 9, truth)]);
    assert!(none.positions.is_empty());
}

#[test]
fn files_whose_maps_are_not_maps_are_refused() {
    let file = |map: PositionMap| {
        let cal = Calibration {
            version: CALIBRATION_VERSION,
            regimes: vec![Regime {
                temperature: 0.0,
                sources: vec![SourceFit {
                    source: "model".into(),
                    positions: vec![PositionFit {
                        map,
                        observations: 40,
                    }],
                }],
            }],
        };
        serde_json::to_string(&cal).expect("json")
    };
    let iso = |x: Vec<f64>, y: Vec<f64>| PositionMap::Isotonic { x, y };
    // Knots without values indexed past y's end in `interpolate`; the others are no maps.
    for (map, needle) in [
        (iso(vec![0.2, 0.5], vec![]), "knots"),
        (iso(vec![0.5, 0.2], vec![0.1, 0.2]), "non-decreasing"),
        (iso(vec![0.2, 0.5], vec![0.1, 1.5]), "[0, 1]"),
        (PositionMap::Temperature { temperature: 0.0 }, "above 0"),
        (PositionMap::Temperature { temperature: -1.0 }, "above 0"),
    ] {
        let e = Calibration::from_json(&file(map)).expect_err("refused");
        assert!(e.contains(needle), "{e}");
    }
    let good = iso(vec![0.2, 0.5], vec![0.1, 0.4]);
    assert!(Calibration::from_json(&file(good)).is_ok());
}

#[test]
fn a_nan_confidence_passes_through_an_isotonic_map() {
    // NaN compares false against every knot, so the search found index 0 and the
    // interpolation read the knot before it.
    let map = PositionMap::Isotonic {
        x: vec![0.2, 0.5],
        y: vec![0.1, 0.4],
    };
    assert!(map.apply(f32::NAN).is_nan());
    assert!((map.apply(0.35) - 0.25).abs() < 1e-6);
}
