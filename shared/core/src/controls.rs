//! Logit controls beyond temperature, top-k and top-p, defined as vLLM and OpenAI define
//! them: the repetition penalty (Keskar et al. 2019, over the prompt and the output), the
//! presence and frequency penalties (over the output), min-p (Nguyen et al. 2024, after
//! temperature) and the masking of end tokens before `min_tokens`.
//!
//! Every control changes the distribution the target samples from, and some depend on the
//! tokens generated so far. Speculative verification applies them to each verified
//! position with the drafted tokens before it counted as output ([`LogitControls::apply`]
//! takes them as `drafted`), so a draft is accepted against exactly the distribution plain
//! decoding would have sampled that position from: speculation stays lossless under every
//! control.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

/// Invalid control values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    /// Repetition penalty outside (0, 2].
    #[error("repetition_penalty must be in (0, 2], got {0}")]
    Repetition(f32),
    /// Presence penalty outside [-2, 2].
    #[error("presence_penalty must be in [-2, 2], got {0}")]
    Presence(f32),
    /// Frequency penalty outside [-2, 2].
    #[error("frequency_penalty must be in [-2, 2], got {0}")]
    Frequency(f32),
    /// min-p outside [0, 1].
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
}

/// Penalties on tokens already seen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Penalties {
    /// Positive logits of tokens in the prompt or the output are divided by it, negative ones
    /// multiplied (1: off).
    pub repetition: f32,
    /// Subtracted from the logit of every token the output holds (0: off).
    pub presence: f32,
    /// Subtracted, times its count in the output, from every token's logit (0: off).
    pub frequency: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self {
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
        }
    }
}

impl Penalties {
    /// Whether any penalty changes logits.
    pub fn is_active(&self) -> bool {
        self.repetition != 1.0 || self.presence != 0.0 || self.frequency != 0.0
    }
}

/// The controls of one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogitControls {
    /// Repetition, presence and frequency penalties.
    pub penalties: Penalties,
    /// Keep only tokens whose probability after temperature reaches `min_p` times the most
    /// likely one's (0: off; no effect on greedy decoding).
    pub min_p: f32,
    /// Tokens in `end_ids` are masked while fewer than this many tokens were generated.
    pub min_tokens: usize,
    /// The tokens that would end the generation (end-of-sequence and stop ids).
    pub end_ids: Vec<u32>,
}

impl LogitControls {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ControlError> {
        let p = &self.penalties;
        if !(p.repetition > 0.0 && p.repetition <= 2.0) {
            return Err(ControlError::Repetition(p.repetition));
        }
        if !(-2.0..=2.0).contains(&p.presence) {
            return Err(ControlError::Presence(p.presence));
        }
        if !(-2.0..=2.0).contains(&p.frequency) {
            return Err(ControlError::Frequency(p.frequency));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ControlError::MinP(self.min_p));
        }
        Ok(())
    }

    /// Whether the position after `generated` tokens needs every logit: penalties and the
    /// masking of end tokens can lift any token to the top. min-p alone does not (it keeps
    /// a top set, which screened logits hold).
    pub fn needs_all_logits(&self, generated: usize) -> bool {
        self.penalties.is_active() || self.masks_end(generated)
    }

    /// Whether end tokens are masked after `generated` tokens.
    pub fn masks_end(&self, generated: usize) -> bool {
        generated < self.min_tokens && !self.end_ids.is_empty()
    }

    /// Whether [`Self::apply`] can change anything for a request sampled at `temperature`.
    pub fn is_active(&self, temperature: f32) -> bool {
        self.penalties.is_active()
            || self.min_tokens > 0 && !self.end_ids.is_empty()
            || self.min_p > 0.0 && temperature > 0.0
    }

    /// Applies the controls to the full `logits` of the position after the generation's
    /// `history` and the `drafted` tokens that follow it, for sampling at `temperature`
    /// (0: greedy, where min-p changes nothing).
    pub fn apply(&self, logits: &mut [f32], history: &History, drafted: &[u32], temperature: f32) {
        if self.penalties.is_active() {
            self.penalise(logits, history, drafted);
        }
        if self.masks_end(history.generated() + drafted.len()) {
            for &id in &self.end_ids {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        min_p_mask(logits, self.min_p, temperature);
    }

    fn penalise(&self, logits: &mut [f32], history: &History, drafted: &[u32]) {
        let p = &self.penalties;
        let mut counts = history.output.clone();
        drafted
            .iter()
            .for_each(|t| *counts.entry(*t).or_default() += 1);
        if p.repetition != 1.0 {
            let seen = history.prompt.iter().chain(counts.keys());
            for id in seen.collect::<HashSet<_>>() {
                if let Some(l) = logits.get_mut(*id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition
                    } else {
                        *l * p.repetition
                    };
                }
            }
        }
        if p.presence != 0.0 || p.frequency != 0.0 {
            for (id, n) in &counts {
                if let Some(l) = logits.get_mut(*id as usize) {
                    *l -= p.frequency * *n as f32 + p.presence;
                }
            }
        }
    }
}

/// Masks (to −∞) the `values` whose probability at `temperature` is below `min_p` times the
/// largest one's: `(l − l_max) / T < ln(min_p)`. Works on any set of logits that holds the
/// largest; a no-op when greedy or `min_p` is 0.
pub fn min_p_mask(values: &mut [f32], min_p: f32, temperature: f32) {
    if min_p <= 0.0 || temperature <= 0.0 {
        return;
    }
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let floor = (min_p as f64).ln();
    for l in values.iter_mut() {
        if ((*l as f64 - max as f64) / temperature as f64) < floor {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// What the controls know of a generation: the prompt's tokens and how often each token
/// occurs in the output.
#[derive(Debug, Clone, Default)]
pub struct History {
    prompt: HashSet<u32>,
    output: HashMap<u32, u32>,
    generated: usize,
}

impl History {
    /// The history of a generation of `prompt`, before its first token.
    pub fn new(prompt: &[u32]) -> Self {
        Self {
            prompt: prompt.iter().copied().collect(),
            ..Self::default()
        }
    }

    /// Counts a generated token.
    pub fn push(&mut self, token: u32) {
        *self.output.entry(token).or_default() += 1;
        self.generated += 1;
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls(repetition: f32, presence: f32, frequency: f32) -> LogitControls {
        LogitControls {
            penalties: Penalties {
                repetition,
                presence,
                frequency,
            },
            ..LogitControls::default()
        }
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens() {
        let mut history = History::new(&[0]);
        history.push(1);
        let mut logits = vec![2.0, -2.0, 2.0, 4.0];
        controls(2.0, 0.0, 0.0).apply(&mut logits, &history, &[3, 3], 0.0);
        assert_eq!(logits, vec![1.0, -4.0, 2.0, 2.0], "each seen token once");
    }

    #[test]
    fn presence_and_frequency_count_output_and_drafted_tokens_not_the_prompt() {
        let mut history = History::new(&[0]);
        history.push(1);
        history.push(1);
        let mut logits = vec![0.0; 4];
        controls(1.0, 0.5, 0.25).apply(&mut logits, &history, &[1, 2], 0.0);
        assert_eq!(logits, vec![0.0, -(0.5 + 3.0 * 0.25), -(0.5 + 0.25), 0.0]);
    }

    #[test]
    fn end_tokens_are_masked_until_min_tokens_counting_drafts() {
        let c = LogitControls {
            min_tokens: 3,
            end_ids: vec![2],
            ..LogitControls::default()
        };
        let mut history = History::new(&[]);
        history.push(0);
        let mut logits = vec![0.0, 0.0, 9.0];
        c.apply(&mut logits, &history, &[1], 0.0);
        assert_eq!(logits[2], f32::NEG_INFINITY, "2 generated: masked");
        let mut logits = vec![0.0, 0.0, 9.0];
        c.apply(&mut logits, &history, &[1, 1], 0.0);
        assert_eq!(logits[2], 9.0, "3 generated: free");
        assert!(c.needs_all_logits(2) && !c.needs_all_logits(3));
    }

    #[test]
    fn min_p_keeps_tokens_within_the_ratio_after_temperature_and_never_when_greedy() {
        // ln(0.1) ≈ −2.303: at T = 1, logits 2.3 below the top go; at T = 2, 4.6 below.
        let base = vec![5.0, 3.0, 2.8, 0.0];
        let mut at1 = base.clone();
        min_p_mask(&mut at1, 0.1, 1.0);
        assert_eq!(at1, vec![5.0, 3.0, 2.8, f32::NEG_INFINITY]);
        let mut at_half = base.clone();
        min_p_mask(&mut at_half, 0.1, 0.5);
        assert_eq!(at_half[2], f32::NEG_INFINITY, "(2.8−5)/0.5 = −4.4 < −2.3");
        let mut greedy = base.clone();
        min_p_mask(&mut greedy, 0.9, 0.0);
        assert_eq!(greedy, base);
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(controls(0.0, 0.0, 0.0).validate().is_err());
        assert!(controls(2.5, 0.0, 0.0).validate().is_err());
        assert!(controls(1.0, 2.5, 0.0).validate().is_err());
        assert!(controls(1.0, 0.0, f32::NAN).validate().is_err());
        let min_p = LogitControls {
            min_p: 1.5,
            ..LogitControls::default()
        };
        assert!(min_p.validate().is_err());
        assert!(controls(1.2, -1.0, 1.0).validate().is_ok());
    }
}
