//! `tandem bench target`'s weight products: every distinct weight matrix of the CPU target
//! (storage type, layout, shape) timed on its own at M = 1..64 activation rows, and the
//! sums per storage type over one forward — what a row of a batched step or a verify block
//! costs in each kind of weight, which is what batching and speculation ride on.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use tandem_gemma::{Gemma3, Weight};

use crate::bench::median;

/// One distinct weight matrix and its cost at each row count.
#[derive(Serialize)]
pub(crate) struct ProductCost {
    qtype: String,
    layout: &'static str,
    n: usize,
    k: usize,
    /// Matrices of the model with this type, layout and shape.
    count: usize,
    /// Milliseconds of one product at each of the report's row counts.
    ms: Vec<f64>,
}

/// All the weights of one storage type in one forward.
#[derive(Serialize)]
pub(crate) struct TypeCost {
    qtype: String,
    layout: &'static str,
    matrices: usize,
    /// Milliseconds of all its products in one forward, at each row count.
    ms_per_forward: Vec<f64>,
    /// The same per activation row, in microseconds.
    us_per_row: Vec<f64>,
    /// Each row count's cost over one row's (how much a row of a batch costs beside the
    /// first, as a share of it).
    vs_one_row: Vec<f64>,
}

/// The weight products of `model` at each of `rows` (timed `repeats` times, the median).
#[derive(Serialize)]
pub(crate) struct Products {
    rows: Vec<usize>,
    shapes: Vec<ProductCost>,
    types: Vec<TypeCost>,
}

type Key = (String, &'static str, usize, usize);

fn key(w: &Weight<'_>) -> Key {
    (format!("{:?}", w.qtype()), w.layout(), w.n(), w.k())
}

/// Times every distinct weight matrix of `model` at each of `rows` activation rows.
pub(crate) fn measure(model: &Gemma3, rows: &[usize], repeats: usize) -> Result<Products> {
    let mut distinct: BTreeMap<Key, (usize, Weight<'_>)> = BTreeMap::new();
    for w in model.weights() {
        distinct
            .entry(key(&w))
            .and_modify(|(count, _)| *count += 1)
            .or_insert((1, w));
    }
    let mut shapes = Vec::with_capacity(distinct.len());
    for ((qtype, layout, n, k), (count, w)) in distinct {
        let mut ms = Vec::with_capacity(rows.len());
        for &m in rows {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919 % 2003) as f32 / 1001.5) - 1.0)
                .collect();
            w.matmul(&x, m)?;
            let mut times = Vec::with_capacity(repeats);
            for _ in 0..repeats {
                let t = Instant::now();
                w.matmul(&x, m)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            ms.push(median(times));
        }
        shapes.push(ProductCost {
            qtype,
            layout,
            n,
            k,
            count,
            ms,
        });
    }
    let types = by_type(&shapes, rows);
    Ok(Products {
        rows: rows.to_vec(),
        shapes,
        types,
    })
}

/// The shapes' costs summed per storage type and layout.
fn by_type(shapes: &[ProductCost], rows: &[usize]) -> Vec<TypeCost> {
    let mut types: BTreeMap<(String, &'static str), (usize, Vec<f64>)> = BTreeMap::new();
    for s in shapes {
        let (matrices, ms) = types
            .entry((s.qtype.clone(), s.layout))
            .or_insert_with(|| (0, vec![0.0; rows.len()]));
        *matrices += s.count;
        ms.iter_mut()
            .zip(&s.ms)
            .for_each(|(t, x)| *t += x * s.count as f64);
    }
    types
        .into_iter()
        .map(|((qtype, layout), (matrices, ms))| TypeCost {
            qtype,
            layout,
            matrices,
            us_per_row: ms
                .iter()
                .zip(rows)
                .map(|(t, m)| t * 1e3 / *m as f64)
                .collect(),
            vs_one_row: ms.iter().map(|t| t / ms[0]).collect(),
            ms_per_forward: ms,
        })
        .collect()
}

/// Prints the per-type table.
pub(crate) fn print(p: &Products) {
    println!("weight products per storage type, one forward (ms; × the one-row cost):");
    let head: Vec<String> = p.rows.iter().map(|m| format!("{m:>14}")).collect();
    println!(
        "{:<6} {:<6} {:>4} {}",
        "type",
        "layout",
        "mats",
        head.join("")
    );
    for t in &p.types {
        let cells: Vec<String> = t
            .ms_per_forward
            .iter()
            .zip(&t.vs_one_row)
            .map(|(ms, x)| format!("{:>8.2} ×{:<4.1}", ms, x))
            .collect();
        println!(
            "{:<6} {:<6} {:>4} {}",
            t.qtype,
            t.layout,
            t.matrices,
            cells.join("")
        );
    }
}
