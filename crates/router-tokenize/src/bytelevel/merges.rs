//! Byte-pair merging of one piece: start from one symbol a byte and apply the merge of
//! lowest rank, leftmost first, until none applies. The order is the one every BPE
//! tokenizer of the `tokenizers` family follows, so the ids are the same.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// The merge rules, by the pair of ids they join.
#[derive(Debug)]
pub(super) struct Merges {
    /// `(left, right)` to `(rank, joined)`.
    rules: FxHashMap<(u32, u32), (u32, u32)>,
}

/// A symbol of the piece being merged: its id and its neighbours (`usize::MAX`: none);
/// a symbol merged into its left neighbour is `GONE`.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
}

/// No neighbour.
const NONE: usize = usize::MAX;

/// The id of a symbol merged into its left neighbour.
const GONE: u32 = u32::MAX;

/// The longest piece, in bytes, merged by scanning rather than with a queue.
const SHORT: usize = 48;

impl Merges {
    /// No rules yet, room for `n`.
    pub(super) fn with_capacity(n: usize) -> Self {
        let mut rules = FxHashMap::default();
        rules.reserve(n);
        Self { rules }
    }

    /// Adds the rule of `rank`; a later rule for the same pair replaces an earlier
    /// one, as when `tokenizers` loads the list.
    pub(super) fn insert(&mut self, left: u32, right: u32, rank: u32, joined: u32) {
        self.rules.insert((left, right), (rank, joined));
    }

    /// The rule joining `left` and `right`: its rank and the joined id.
    fn rule(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.rules.get(&(left, right)).copied()
    }

    /// Appends the ids `symbols` merge into to `out`.
    pub(super) fn apply(&self, symbols: &mut Vec<u32>, out: &mut Vec<u32>) {
        if symbols.len() <= SHORT {
            self.apply_short(symbols);
            out.extend_from_slice(symbols);
        } else {
            self.apply_long(symbols, out);
        }
    }

    /// Merging in place, finding the next merge by scanning the pairs: for a short
    /// piece (most are a few bytes) cheaper than a queue. The merge applied is the
    /// same: the lowest rank, then the leftmost.
    fn apply_short(&self, symbols: &mut Vec<u32>) {
        // The rule of each adjacent pair: (rank, joined), rank u32::MAX for none.
        let mut rules: Vec<(u32, u32)> = symbols
            .windows(2)
            .map(|pair| self.rule(pair[0], pair[1]).unwrap_or((u32::MAX, 0)))
            .collect();
        loop {
            let Some((at, &(rank, joined))) = rules
                .iter()
                .enumerate()
                .min_by_key(|&(at, &(rank, _))| (rank, at))
            else {
                return;
            };
            if rank == u32::MAX {
                return;
            }
            symbols[at] = joined;
            symbols.remove(at + 1);
            rules.remove(at);
            if at > 0 {
                rules[at - 1] = self.rule(symbols[at - 1], joined).unwrap_or((u32::MAX, 0));
            }
            if at < rules.len() {
                rules[at] = self.rule(joined, symbols[at + 1]).unwrap_or((u32::MAX, 0));
            }
        }
    }

    /// Merging with a queue of candidate merges, for long pieces.
    fn apply_long(&self, symbols: &[u32], out: &mut Vec<u32>) {
        let mut word: Vec<Symbol> = symbols
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == symbols.len() { NONE } else { i + 1 },
            })
            .collect();
        // (rank, position, joined), lowest rank first, then leftmost.
        let mut queue: BinaryHeap<Reverse<(u32, usize, u32)>> = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(pos, pair)| {
                let (rank, joined) = self.rule(pair[0], pair[1])?;
                Some(Reverse((rank, pos, joined)))
            })
            .collect();
        while let Some(Reverse((_, pos, joined))) = queue.pop() {
            let left = word[pos];
            if left.id == GONE || left.next == NONE {
                continue;
            }
            let right = word[left.next];
            // An entry whose pair changed since it was queued is stale.
            if self
                .rule(left.id, right.id)
                .is_none_or(|(_, now)| now != joined)
            {
                continue;
            }
            word[pos].id = joined;
            word[pos].next = right.next;
            word[left.next].id = GONE;
            if right.next != NONE {
                word[right.next].prev = pos;
            }
            let current = word[pos];
            if current.prev != NONE
                && let Some((rank, joined)) = self.rule(word[current.prev].id, current.id)
            {
                queue.push(Reverse((rank, current.prev, joined)));
            }
            if current.next != NONE
                && let Some((rank, joined)) = self.rule(current.id, word[current.next].id)
            {
                queue.push(Reverse((rank, pos, joined)));
            }
        }
        out.extend(word.iter().filter(|s| s.id != GONE).map(|s| s.id));
    }
}
