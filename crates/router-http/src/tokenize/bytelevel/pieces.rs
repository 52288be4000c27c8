//! Cutting normalized text into the pieces BPE merges: every match of the
//! pre-tokenizer's regex is a piece, and so is every stretch between matches.
//!
//! The byte-level patterns in use (GPT-2's, and Qwen's and Llama 3's after it) end
//! with `|\s+(?!\S)|\s+`: a run of whitespace leaves its last character to the word
//! that follows it. Lookahead needs a backtracking engine (`fancy-regex`, what
//! `tokenizers` runs); such a pattern `A|\s+(?!\S)|\s+` is matched here without
//! it, as `A|\s+` by the `regex` engines, giving the same pieces: both match at the
//! same places, and where `A` does not match, `\s+(?!\S)` is the run of whitespace
//! without its last character when a non-space follows and the run has two or more,
//! else (like `\s+`) the whole run.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

/// The tail of the patterns matched without lookahead.
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";

/// See the module documentation.
#[derive(Debug)]
pub(super) enum Pieces {
    /// The whole text is one piece.
    Whole,
    /// The pattern, with `A|\s+` and `A` for a pattern `A|\s+(?!\S)|\s+`.
    Pattern {
        fancy: fancy_regex::Regex,
        plain: Option<(Regex, Regex)>,
    },
}

impl Pieces {
    /// `None` when the pattern does not compile.
    pub(super) fn new(pattern: Option<&str>) -> Option<Self> {
        let Some(pattern) = pattern else {
            return Some(Self::Whole);
        };
        let fancy = fancy_regex::Regex::new(pattern).ok()?;
        let plain = pattern.strip_suffix(LOOKAHEAD_TAIL).and_then(|a| {
            let any = Regex::new(&format!(r"(?:{a})|\s+")).ok()?;
            let first = Regex::new(a).ok()?;
            Some((any, first))
        });
        Some(Self::Pattern { fancy, plain })
    }

    /// Calls `piece` with each piece of `text`, in order.
    ///
    /// # Errors
    /// The backtracking engine gave up on this text (its backtracking limit).
    pub(super) fn each(&self, text: &str, mut piece: impl FnMut(&str)) -> Result<(), String> {
        match self {
            Pieces::Whole => piece(text),
            Pieces::Pattern {
                plain: Some((any, first)),
                ..
            } => {
                let mut end = 0;
                while let Some(found) = any.find(Input::new(text).range(end..)) {
                    let (start, mut stop) = (found.start(), found.end());
                    if start == stop {
                        // An empty match: `tokenizers` steps over it as its engine
                        // does; leave the whole text to that engine.
                        return self.each_fancy(text, piece);
                    }
                    let run = &text[start..stop];
                    if stop < text.len() && run.chars().all(char::is_whitespace) {
                        let last = run.chars().next_back().map_or(0, char::len_utf8);
                        let from_a = first
                            .search(&Input::new(text).range(start..).anchored(Anchored::Yes))
                            .is_some();
                        if !from_a && run.len() > last {
                            stop -= last;
                        }
                    }
                    piece(&text[end..start]);
                    piece(&text[start..stop]);
                    end = stop;
                }
                piece(&text[end..]);
            }
            Pieces::Pattern { plain: None, .. } => return self.each_fancy(text, piece),
        }
        Ok(())
    }

    fn each_fancy(&self, text: &str, mut piece: impl FnMut(&str)) -> Result<(), String> {
        let Pieces::Pattern { fancy, .. } = self else {
            piece(text);
            return Ok(());
        };
        let mut end = 0;
        for found in fancy.find_iter(text) {
            let found = found.map_err(|e| format!("the pre-tokenizer's regex failed: {e}"))?;
            piece(&text[end..found.start()]);
            piece(found.as_str());
            end = found.end();
        }
        piece(&text[end..]);
        Ok(())
    }
}
