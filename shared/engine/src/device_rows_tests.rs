//! [`DeviceRows`] against the host's whole distributions, on CPU tensors (the reductions
//! are candle operations, the same on every device).

use candle_core::{Device, Tensor};
use tandem_core::{distribution, BuiltRows, SamplingParams, SparseDist, TargetRows};
use tandem_testkit::Lcg;

use super::*;

/// Vocabulary of the test rows: not a multiple of [`CHUNK`], so the last chunk is padded.
const VOCAB: usize = 3 * CHUNK + 517;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..SamplingParams::default()
    }
}

/// Rows of logits spread like a language model's: a few large, most small.
fn logit_rows(seed: u64, rows: usize) -> Vec<Vec<f32>> {
    let mut lcg = Lcg::new(seed);
    (0..rows)
        .map(|_| {
            (0..VOCAB)
                .map(|_| {
                    let x = lcg.next();
                    x * 4.0 + if lcg.next() > 0.995 { 12.0 } else { 0.0 }
                })
                .collect()
        })
        .collect()
}

/// The boundaries of `d`'s cumulative distribution in draw order.
fn boundaries(d: &SparseDist) -> Vec<f64> {
    d.probs
        .iter()
        .scan(0f64, |acc, p| {
            *acc += *p as f64;
            Some(*acc)
        })
        .collect()
}

/// Uniforms spread over [0, 1), those within rounding of one of `cuts` left out (there
/// the two sides may round to neighbouring tokens).
fn uniforms(cuts: &[f64]) -> Vec<f64> {
    (0..4000)
        .map(|i| (i as f64 + 0.37) / 4000.0)
        .filter(|u| cuts.iter().all(|c| (u - c).abs() > 1e-5))
        .collect()
}

#[test]
fn draws_and_probabilities_are_the_host_distributions() {
    let rows = logit_rows(3, 3);
    let logits = Tensor::new(rows.clone(), &Device::Cpu).expect("logits");
    for t in [0.3f32, 0.7, 1.0, 1.5] {
        let mut device = DeviceRows::new(&logits, t);
        for (i, row) in rows.iter().enumerate() {
            let host = distribution(row, &params(t));
            for id in [0u32, 17, 1500, VOCAB as u32 - 1] {
                let (got, want) = (device.prob(i, id), host.prob(id) as f64);
                assert!((got - want).abs() <= 1e-6 * want.max(1e-12), "{got} {want}");
            }
            assert_eq!(device.prob(i, VOCAB as u32 + 5), 0.0, "past the vocabulary");
            let us = uniforms(&boundaries(&host));
            assert!(us.len() > 3000, "T = {t}: {} uniforms kept", us.len());
            for u in us {
                assert_eq!(device.draw(i, u), host.draw(u), "T = {t}, row {i}, u = {u}");
            }
        }
        device.finish().expect("no device error");
    }
}

#[test]
fn residual_draws_are_the_host_residuals() {
    let rows = logit_rows(8, 2);
    let logits = Tensor::new(rows.clone(), &Device::Cpu).expect("logits");
    let mut lcg = Lcg::new(21);
    let p = params(0.8);
    for (i, row) in rows.iter().enumerate() {
        // A drafter's proposal: the target's row with noise, on a subset of the ids (as a
        // draft vocabulary and a trimmed tail leave it), in no particular order.
        let noisy: Vec<f32> = row.iter().map(|x| x + lcg.next() * 3.0).collect();
        let q = distribution(&noisy, &p).without_tail(VOCAB);
        let mut q_shuffled = q.clone();
        q_shuffled.ids.reverse();
        q_shuffled.probs.reverse();
        let host = distribution(row, &p);
        let mut built = BuiltRows::new(|_| host.clone());
        let cuts = residual_boundaries(&host, &q);
        let us = uniforms(&cuts);
        assert!(us.len() > 3000);
        let mut device = DeviceRows::new(&logits, 0.8);
        for u in us {
            let want = built.draw_residual(i, &q, u);
            assert_eq!(device.draw_residual(i, &q, u), want, "row {i}, u = {u}");
            assert_eq!(device.draw_residual(i, &q_shuffled, u), want);
        }
        device.finish().expect("no device error");
    }
}

/// A residual that `q` empties (q = p) is drawn as `p` itself, as on the host; so is one
/// that `q` leaves whole (no id of `q` in the row).
#[test]
fn an_empty_residual_draws_from_the_row() {
    let rows = logit_rows(4, 1);
    let logits = Tensor::new(rows.clone(), &Device::Cpu).expect("logits");
    let host = distribution(&rows[0], &params(1.0));
    let mut device = DeviceRows::new(&logits, 1.0);
    let beyond = SparseDist {
        ids: vec![VOCAB as u32 + 1],
        probs: vec![1.0],
    };
    for u in uniforms(&boundaries(&host)).into_iter().step_by(97) {
        assert_eq!(device.draw_residual(0, &host, u), host.draw(u));
        assert_eq!(
            device.draw_residual(0, &beyond, u),
            host.draw(u),
            "q off the row"
        );
    }
}

/// The boundaries of the host residual `norm(max(p − q, 0))` in draw order.
fn residual_boundaries(p: &SparseDist, q: &SparseDist) -> Vec<f64> {
    let mut mass: Vec<f64> = p.probs.iter().map(|x| *x as f64).collect();
    for (id, qp) in q.ids.iter().zip(&q.probs) {
        mass[*id as usize] -= *qp as f64;
    }
    let total: f64 = mass.iter().map(|m| m.max(0.0)).sum();
    boundaries(&SparseDist {
        ids: p.ids.clone(),
        probs: mass.iter().map(|m| (m.max(0.0) / total) as f32).collect(),
    })
}

#[test]
fn walks_stop_where_the_mass_passes_the_target_or_at_the_last_mass() {
    let masses = [0.0, 0.25, 0.0, 0.5, 0.25, 0.0];
    let at = |t: f64| walk(masses.iter().copied(), t);
    assert_eq!(at(0.0), 1);
    assert_eq!(at(0.2499), 1);
    assert_eq!(at(0.25), 3);
    assert_eq!(at(0.9), 4);
    assert_eq!(at(1.0), 4, "past the total: the last with mass");
    assert_eq!(walk_from(0.5, [0.25, 0.25].into_iter(), 0.6), 0);
}

#[test]
fn only_sampling_at_a_temperature_alone_off_the_host_is_reduced() {
    let logits = Tensor::zeros((1, 8), candle_core::DType::F32, &Device::Cpu).expect("t");
    assert!(!reduces_on_device(&logits, &params(0.7)), "host logits");
}

/// A step's draws made together are the draws each row's [`DeviceRows`] makes with the same
/// uniform, at mixed temperatures, each from the last row of its generation's logits.
#[test]
fn draws_made_together_are_each_rows_own() {
    let temps = [0.7f32, 0.7, 1.0, 0.3];
    let blocks: Vec<Tensor> = (0..temps.len())
        .map(|i| Tensor::new(logit_rows(30 + i as u64, 1 + i % 2), &Device::Cpu))
        .collect::<candle_core::Result<_>>()
        .expect("logits");
    let mut lcg = Lcg::new(9);
    for _ in 0..200 {
        let draws: Vec<(&Tensor, Draw)> = (blocks.iter().zip(temps))
            .map(|(logits, temperature)| {
                let u = lcg.next() as f64;
                (logits, Draw { temperature, u })
            })
            .collect();
        let together = draw_last_rows(&draws).expect("draws");
        for ((logits, d), got) in draws.iter().zip(together) {
            let mut own = DeviceRows::new(logits, d.temperature);
            let last = logits.dim(0).expect("rows") - 1;
            assert_eq!(got, own.draw(last, d.u), "{d:?}");
        }
    }
    assert!(draw_last_rows(&[]).expect("none").is_empty());
}
