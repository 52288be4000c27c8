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
    /// A pattern on the backtracking engine.
    Fancy(fancy_regex::Regex),
    /// A pattern `A|\s+(?!\S)|\s+` as `A|\s+`, with `A` alone.
    Plain { any: Regex, first: Regex },
}

impl Pieces {
    /// `None` when the pattern does not compile.
    pub(super) fn new(pattern: Option<&str>) -> Option<Self> {
        let Some(pattern) = pattern else {
            return Some(Self::Whole);
        };
        if let Some(a) = pattern
            .strip_suffix(LOOKAHEAD_TAIL)
            .filter(|a| plain_matches(a))
            && let (Ok(any), Ok(first)) = (Regex::new(&format!(r"(?:{a})|\s+")), Regex::new(a))
        {
            return Some(Self::Plain { any, first });
        }
        fancy_regex::Regex::new(pattern).ok().map(Self::Fancy)
    }

    /// Calls `piece` with each piece of `text`, in order, until it returns false;
    /// returns whether it did.
    pub(super) fn each(&self, text: &str, mut piece: impl FnMut(&str) -> bool) -> bool {
        match self {
            Pieces::Whole => !piece(text),
            Pieces::Fancy(regex) => each_fancy(regex, text, piece),
            Pieces::Plain { any, first } => {
                let mut end = 0;
                // `A` never matches empty (`plain_matches`), nor does `\s+`. Pieces
                // mostly follow each other: a match at `end` is looked for first,
                // anchored there, which spares the search for where a match starts.
                while let Some(found) = any
                    .search(&Input::new(text).range(end..).anchored(Anchored::Yes))
                    .or_else(|| any.find(Input::new(text).range(end..)))
                {
                    let (start, mut stop) = (found.start(), found.end());
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
                    if !(piece(&text[end..start]) && piece(&text[start..stop])) {
                        return true;
                    }
                    end = stop;
                }
                !piece(&text[end..])
            }
        }
    }
}

/// Whether `A` can be matched as `(?:A)|\s+` with the same matches: it never matches
/// empty (an empty match would be stepped over differently) and sets no `U` flag
/// (which in the whole pattern would also make `\s+(?!\S)` lazy).
fn plain_matches(a: &str) -> bool {
    let sets_lazy = a.match_indices("(?").any(|(at, _)| {
        a[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || *c == '-')
            .any(|c| c == 'U')
    });
    !sets_lazy
        && regex_automata::util::syntax::parse(a)
            .is_ok_and(|hir| hir.properties().minimum_len().is_some_and(|m| m > 0))
}

/// The pieces by the backtracking engine. Where it gives up (its backtracking limit),
/// the rest of the text is one piece, as `tokenizers` takes it.
fn each_fancy(regex: &fancy_regex::Regex, text: &str, mut piece: impl FnMut(&str) -> bool) -> bool {
    let mut end = 0;
    for found in regex.find_iter(text) {
        let Ok(found) = found else {
            break;
        };
        if !(piece(&text[end..found.start()]) && piece(found.as_str())) {
            return true;
        }
        end = found.end();
    }
    !piece(&text[end..])
}
