//! The report of `tandem bench load`: its table, and each mode's aggregate throughput over
//! plain decoding's paired by round (the geometric mean of the rounds' ratios with a
//! Student-t interval on their logarithms).

use serde::{Deserialize, Serialize};
use tandem_core::ab::mean_interval;

use crate::bench_load::{Level, LoadMode, LoadReport};

/// One mode's aggregate tok/s over plain's at one concurrency, by round.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PairedRatio {
    pub mode: LoadMode,
    pub concurrency: usize,
    /// Each round's ratio, in round order.
    pub ratios: Vec<f64>,
    /// Their geometric mean, and its 95 % interval (the ratio itself with one round).
    pub geomean: f64,
    pub low: f64,
    pub high: f64,
}

/// Every non-plain mode's ratios to plain, at each concurrency and round where both ran.
pub fn pair(levels: &[Level]) -> Vec<PairedRatio> {
    let plain = |c: usize, round: usize| {
        levels
            .iter()
            .find(|l| l.mode == LoadMode::Plain && l.concurrency == c && l.round == round)
            .map(|l| l.aggregate_tok_s)
            .filter(|t| *t > 0.0)
    };
    let mut out: Vec<PairedRatio> = Vec::new();
    for l in levels.iter().filter(|l| l.mode != LoadMode::Plain) {
        let Some(base) = plain(l.concurrency, l.round) else {
            continue;
        };
        let ratio = l.aggregate_tok_s / base;
        match out
            .iter_mut()
            .find(|p| p.mode == l.mode && p.concurrency == l.concurrency)
        {
            Some(p) => p.ratios.push(ratio),
            None => out.push(PairedRatio {
                mode: l.mode,
                concurrency: l.concurrency,
                ratios: vec![ratio],
                geomean: ratio,
                low: ratio,
                high: ratio,
            }),
        }
    }
    for p in &mut out {
        let logs: Vec<f64> = p.ratios.iter().map(|r| r.ln()).collect();
        let m = logs.iter().sum::<f64>() / logs.len() as f64;
        p.geomean = m.exp();
        if let Ok(i) = mean_interval(&logs, 0.95) {
            (p.low, p.high) = (i.low.exp(), i.high.exp());
        }
    }
    out
}

/// Prints the table of levels, then the paired ratios.
pub fn print_report(r: &LoadReport) {
    println!(
        "bench load: {} tokens per request, T = {} ({}), γ ≤ {}, {} drafter(s), batching {}; prompts: {}",
        r.max_tokens, r.temperature, r.verification, r.gamma, r.drafters, r.batching, r.prompts
    );
    println!(
        "{:<9} {:>3} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6} {:>6} {:>7} {:>5} {:>6} {:>7} {:>5} {:>6} {:>5}",
        "mode",
        "C",
        "agg tok/s",
        "busy tok/s",
        "user t/s",
        "user p10",
        "ttft p50",
        "ttft p99",
        "itl p50",
        "itl p99",
        "sess",
        "rows",
        "acc",
        "step ms",
        "rpc/r",
        "rpc ms",
        "gath ms",
        "miss",
        "cyc ms",
        "shed"
    );
    for l in &r.levels {
        println!(
            "{:<9} {:>3} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>6.2} {:>6.1} {:>6.2} {:>7.2} {:>5.1} {:>6.2} {:>7.2} {:>5.2} {:>6.2} {:>5.2}",
            format!("{:?}", l.mode).to_lowercase(),
            l.concurrency,
            l.aggregate_tok_s,
            l.busy_tok_s,
            l.per_user_tok_s,
            l.per_user_p10_tok_s,
            l.ttft_p50_ms,
            l.ttft_p99_ms,
            l.itl_p50_ms,
            l.itl_p99_ms,
            l.sessions_per_step,
            l.rows_per_step,
            l.acceptance,
            l.step_ms,
            l.draft_rpcs_per_request,
            l.draft_rpc_ms,
            l.gather_ms,
            l.missed_per_step,
            l.cycle_ms,
            l.shed_per_request
        );
    }
    for p in &r.paired {
        let each: Vec<String> = p.ratios.iter().map(|x| format!("{x:.3}")).collect();
        println!(
            "{} / plain at {} clients: {:.3}× (95 % {:.3}–{:.3}; rounds {})",
            format!("{:?}", p.mode).to_lowercase(),
            p.concurrency,
            p.geomean,
            p.low,
            p.high,
            each.join(" ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(mode: LoadMode, concurrency: usize, round: usize, tok_s: f64) -> Level {
        Level {
            mode,
            concurrency,
            round,
            requests: 1,
            tokens: 1,
            wall_s: 1.0,
            aggregate_tok_s: tok_s,
            per_user_tok_s: tok_s,
            ttft_p50_ms: 0.0,
            ttft_p99_ms: 0.0,
            itl_p50_ms: 0.0,
            itl_p99_ms: 0.0,
            sessions_per_step: 0.0,
            rows_per_step: 0.0,
            acceptance: 0.0,
            busy_s: 0.0,
            busy_tok_s: 0.0,
            per_user_p10_tok_s: 0.0,
            step_ms: 0.0,
            draft_rpcs_per_request: 0.0,
            draft_rpc_ms: 0.0,
            gather_ms: 0.0,
            missed_per_step: 0.0,
            cycle_ms: 0.0,
            shed_per_request: 0.0,
        }
    }

    /// A machine that slows by half between rounds leaves the paired ratios alone; the
    /// interval is the t interval of their logarithms.
    #[test]
    fn ratios_pair_by_round() {
        use LoadMode::{Plain, Scheduled};
        let levels = [
            level(Plain, 2, 0, 200.0),
            level(Scheduled, 2, 0, 220.0),
            level(Plain, 2, 1, 100.0),
            level(Scheduled, 2, 1, 100.0),
            level(Plain, 4, 0, 300.0),
            level(Scheduled, 4, 0, 240.0),
        ];
        let p = pair(&levels);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].mode, p[0].concurrency), (Scheduled, 2));
        assert_eq!(p[0].ratios, vec![1.1, 1.0]);
        assert!((p[0].geomean - 1.1f64.sqrt()).abs() < 1e-12);
        // Logarithms ln 1.1 and 0: mean ± 12.706 · sd / √2, sd = ln 1.1 / √2.
        let half = 12.706_204_736 * 1.1f64.ln() / 2.0;
        let mean = 1.1f64.ln() / 2.0;
        assert!((p[0].low - (mean - half).exp()).abs() < 1e-6, "{p:?}");
        assert!((p[0].high - (mean + half).exp()).abs() < 1e-6, "{p:?}");
        assert_eq!(p[1].ratios, vec![0.8]);
        assert_eq!((p[1].low, p[1].geomean, p[1].high), (0.8, 0.8, 0.8));
    }
}
