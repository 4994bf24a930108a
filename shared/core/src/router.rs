//! Which of several drafters a generation's prompt belongs to: a multinomial naive Bayes
//! classifier over token ids (McCallum & Nigam, "A comparison of event models for naive
//! Bayes text classification", 1998). Each class (a route) keeps a smoothed log-probability
//! for every id seen often enough in its training text and one for all other ids; a prompt
//! scores, per class, its bias plus the mean log-probability of its tokens, and goes to the
//! highest score. Cheap (one binary search a token, once a generation) and deterministic;
//! the choice changes which drafter drafts, never what is generated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A fitted token classifier (see the module docs); serialisable as part of a router file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRouter {
    /// The classes, in route order.
    pub classes: Vec<String>,
    /// Ids with log-probabilities of their own, strictly ascending.
    pub ids: Vec<u32>,
    /// Per class, the log-probability of each of `ids`.
    pub log_probs: Vec<Vec<f32>>,
    /// Per class, the log-probability given to any id not in `ids`.
    pub unseen: Vec<f32>,
    /// Per class, added to its mean log-probability.
    pub bias: Vec<f32>,
    /// Fewest tokens a prompt needs to be routed; shorter ones take the caller's default
    /// (a few tokens say too little about the text).
    #[serde(default = "one")]
    pub min_tokens: usize,
    /// Most tokens read from a prompt's start (the length the router was fitted and
    /// checked on); `None` reads them all.
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

fn one() -> usize {
    1
}

/// How [`TokenRouter::fit`] counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitConfig {
    /// Additive (Laplace) smoothing of every count.
    pub alpha: f64,
    /// Fewest occurrences, over all classes, for an id to keep log-probabilities of its
    /// own; rarer ids share the unseen bucket.
    pub min_count: u64,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            min_count: 4,
        }
    }
}

/// Why a router cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid token router: {0}")]
pub struct RouterError(pub String);

impl TokenRouter {
    /// Fits one class per `(name, texts)`, each text a token sequence; biases start at 0.
    pub fn fit(classes: &[(String, Vec<Vec<u32>>)], cfg: FitConfig) -> Result<Self, RouterError> {
        if classes.len() < 2 || classes.iter().any(|(_, t)| t.iter().all(Vec::is_empty)) {
            return Err(RouterError(
                "fitting needs at least two classes, each with tokens".into(),
            ));
        }
        if !(cfg.alpha > 0.0 && cfg.alpha.is_finite()) {
            return Err(RouterError(format!("alpha must be > 0, got {}", cfg.alpha)));
        }
        let counts: Vec<BTreeMap<u32, u64>> = classes
            .iter()
            .map(|(_, texts)| {
                let mut c = BTreeMap::new();
                for &t in texts.iter().flatten() {
                    *c.entry(t).or_insert(0u64) += 1;
                }
                c
            })
            .collect();
        let mut all: BTreeMap<u32, u64> = BTreeMap::new();
        for c in &counts {
            for (&id, &n) in c {
                *all.entry(id).or_insert(0) += n;
            }
        }
        let ids: Vec<u32> = (all.iter())
            .filter(|&(_, &n)| n >= cfg.min_count)
            .map(|(&id, _)| id)
            .collect();
        // One symbol more than the kept ids: every other id, pooled.
        let symbols = ids.len() as f64 + 1.0;
        let (mut log_probs, mut unseen) = (Vec::new(), Vec::new());
        for c in &counts {
            let total: u64 = c.values().sum();
            let kept: u64 = ids.iter().map(|id| c.get(id).copied().unwrap_or(0)).sum();
            let denom = total as f64 + cfg.alpha * symbols;
            let lp = |n: u64| ((n as f64 + cfg.alpha) / denom).ln() as f32;
            log_probs.push(
                ids.iter()
                    .map(|id| lp(c.get(id).copied().unwrap_or(0)))
                    .collect(),
            );
            unseen.push(lp(total - kept));
        }
        Ok(Self {
            classes: classes.iter().map(|(n, _)| n.clone()).collect(),
            bias: vec![0.0; classes.len()],
            min_tokens: 1,
            max_tokens: None,
            ids,
            log_probs,
            unseen,
        })
    }

    /// Checks the shapes and values a file may have broken.
    pub fn check(&self) -> Result<(), RouterError> {
        let k = self.classes.len();
        if k < 2 {
            return Err(RouterError(format!(
                "{k} classes; a router needs at least 2"
            )));
        }
        if self.log_probs.len() != k || self.unseen.len() != k || self.bias.len() != k {
            return Err(RouterError(format!(
                "{k} classes but {} log-probability rows, {} unseen values and {} biases",
                self.log_probs.len(),
                self.unseen.len(),
                self.bias.len()
            )));
        }
        if let Some(row) = self.log_probs.iter().find(|r| r.len() != self.ids.len()) {
            return Err(RouterError(format!(
                "a log-probability row has {} values for {} ids",
                row.len(),
                self.ids.len()
            )));
        }
        if self.max_tokens.is_some_and(|m| m < self.min_tokens.max(1)) {
            return Err(RouterError(format!(
                "it reads at most {:?} tokens but routes prompts of {} or more",
                self.max_tokens, self.min_tokens
            )));
        }
        if self.ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(RouterError("ids are not strictly ascending".into()));
        }
        let values = (self.log_probs.iter().flatten()).chain(&self.unseen);
        if values.chain(&self.bias).any(|v| !v.is_finite()) {
            return Err(RouterError(
                "a log-probability or bias is not finite".into(),
            ));
        }
        Ok(())
    }

    /// Checks that `names` are the classes, in order (the routes a router chooses between).
    pub fn check_classes<S: AsRef<str>>(&self, names: &[S]) -> Result<(), RouterError> {
        if names
            .iter()
            .map(AsRef::as_ref)
            .eq(self.classes.iter().map(String::as_str))
        {
            return Ok(());
        }
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        Err(RouterError(format!(
            "routes {names:?} are not the router's classes {:?}",
            self.classes
        )))
    }

    /// Each class's score for `tokens`: its bias plus the mean log-probability of the
    /// tokens (the bias alone for no tokens).
    pub fn scores(&self, tokens: &[u32]) -> Vec<f64> {
        let mut sums = vec![0.0f64; self.classes.len()];
        for t in tokens {
            match self.ids.binary_search(t) {
                Ok(i) => (sums.iter_mut().zip(&self.log_probs))
                    .for_each(|(s, row)| *s += f64::from(row[i])),
                Err(_) => {
                    (sums.iter_mut().zip(&self.unseen)).for_each(|(s, u)| *s += f64::from(*u))
                }
            }
        }
        let n = tokens.len().max(1) as f64;
        (sums.iter().zip(&self.bias))
            .map(|(s, b)| s / n + f64::from(*b))
            .collect()
    }

    /// The class of `tokens` (the first of equal scores), read up to `max_tokens`; `None`
    /// for fewer than `min_tokens` (or no) tokens.
    pub fn route(&self, tokens: &[u32]) -> Option<usize> {
        let tokens = &tokens[..tokens.len().min(self.max_tokens.unwrap_or(usize::MAX))];
        if tokens.len() < self.min_tokens.max(1) {
            return None;
        }
        Some(self.best(tokens))
    }

    /// The class with the highest score (the first of equal ones).
    fn best(&self, tokens: &[u32]) -> usize {
        let scores = self.scores(tokens);
        (0..scores.len())
            .reduce(|best, c| if scores[c] > scores[best] { c } else { best })
            .unwrap_or(0)
    }

    /// The mean over classes of the share of each class's `held_out[c]` texts routed to it.
    pub fn balanced_accuracy(&self, held_out: &[Vec<Vec<u32>>]) -> f64 {
        self.accuracy_by(held_out, |t| self.route(t))
    }

    /// The share of `texts` (of class `class`) routed to `class`; 0 for no texts.
    pub fn recall(&self, texts: &[Vec<u32>], class: usize) -> f64 {
        recall_by(texts, class, |t| self.route(t))
    }

    /// [`Self::balanced_accuracy`] of the texts cut to their first `len` tokens, whatever
    /// `min_tokens` says: how well prompts of that length would be routed.
    pub fn accuracy_at(&self, held_out: &[Vec<Vec<u32>>], len: usize) -> f64 {
        self.accuracy_by(held_out, |t| Some(self.best(&t[..len.min(t.len())])))
    }

    /// The mean recall, by `route`, of the classes with texts.
    fn accuracy_by(
        &self,
        held_out: &[Vec<Vec<u32>>],
        route: impl Fn(&[u32]) -> Option<usize>,
    ) -> f64 {
        let recalls: Vec<f64> = (held_out.iter().enumerate())
            .filter(|(_, texts)| !texts.is_empty())
            .map(|(c, texts)| recall_by(texts, c, &route))
            .collect();
        recalls.iter().sum::<f64>() / recalls.len().max(1) as f64
    }

    /// Sets the first class's bias (of two) where it routes `held_out` (texts of each
    /// class) with the highest balanced accuracy, the midpoint of the best gap between
    /// margins (ties: the smallest change from 0). Returns that accuracy.
    pub fn tune_first_bias(&mut self, held_out: &[Vec<Vec<u32>>]) -> Result<f64, RouterError> {
        if self.classes.len() != 2 || held_out.len() != 2 || held_out.iter().any(Vec::is_empty) {
            return Err(RouterError(
                "tuning needs two classes, each with held-out texts".into(),
            ));
        }
        self.bias[0] = 0.0;
        // A text goes to class 0 where its margin (score 0 − score 1) plus the bias is >= 0.
        let margins: Vec<Vec<f64>> = (held_out.iter())
            .map(|texts| {
                texts
                    .iter()
                    .map(|t| {
                        let s = self.scores(t);
                        s[0] - s[1]
                    })
                    .collect()
            })
            .collect();
        let mut cuts: Vec<f64> = margins.iter().flatten().map(|m| -m).collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        let mut candidates = vec![0.0];
        candidates.extend(cuts.windows(2).map(|w| (w[0] + w[1]) / 2.0));
        candidates.extend(cuts.first().map(|c| c - 1.0));
        candidates.extend(cuts.last().map(|c| c + 1.0));
        // Judged as stored: the bias is an f32.
        let candidates = candidates.into_iter().map(|b| f64::from(b as f32));
        let accuracy = |b: f64| {
            let first = margins[0].iter().filter(|&&m| m + b >= 0.0).count();
            let second = margins[1].iter().filter(|&&m| m + b < 0.0).count();
            (first as f64 / margins[0].len() as f64 + second as f64 / margins[1].len() as f64) / 2.0
        };
        let best = candidates
            .map(|b| (accuracy(b), b))
            .reduce(
                |a, c| match (c.0 > a.0) || (c.0 == a.0 && c.1.abs() < a.1.abs()) {
                    true => c,
                    false => a,
                },
            )
            .unwrap_or((accuracy(0.0), 0.0));
        self.bias[0] = best.1 as f32;
        Ok(self.balanced_accuracy(held_out))
    }
}

/// The share of `texts` that `route` sends to `class` (0 for no texts).
fn recall_by(texts: &[Vec<u32>], class: usize, route: impl Fn(&[u32]) -> Option<usize>) -> f64 {
    let right = texts.iter().filter(|t| route(t) == Some(class)).count();
    right as f64 / texts.len().max(1) as f64
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
