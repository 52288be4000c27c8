//! The holders of a `cache_aware` pick in the order it weighs them: least uncached
//! work, then least prefill pressure, then candidate order (id order, as a group gives
//! its candidates). Their load is read a run of equal work at a time, when the pick
//! reaches that run, so a pick whose winner is among the deepest holders reads no
//! other holder's load.

use std::collections::VecDeque;

use router_state::EngineObservation;

/// A holder among the candidates, its load not read yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holding {
    /// Its place among the candidates.
    pub(super) index: usize,
    /// Prompt tokens it holds, on any tier.
    pub(super) matched: u64,
    /// Prompt tokens less those credited.
    pub(super) uncached: u64,
}

/// A holder and its load.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holder {
    /// Its place among the candidates.
    pub(super) index: usize,
    /// Prompt tokens it holds, on any tier.
    pub(super) matched: u64,
    /// Prompt tokens less those credited.
    pub(super) uncached: u64,
    pub(super) observation: EngineObservation,
}

impl Holding {
    /// This holder with its load.
    pub(super) fn read(self, observation: EngineObservation) -> Holder {
        Holder {
            index: self.index,
            matched: self.matched,
            uncached: self.uncached,
            observation,
        }
    }
}

/// Holders in order, read as they are reached. A holder taken is named by its place
/// among those read ([`InOrder::get`]), so the walk moves no holder.
pub(super) struct InOrder<'a> {
    /// In order of uncached work; those from `next_unread` on are not read yet.
    unread: Vec<Holding>,
    next_unread: usize,
    /// Every holder read so far, a run at a time, each run in order.
    read: Vec<Holder>,
    /// Places in `read` to take next, in order.
    queue: VecDeque<usize>,
    observe: &'a dyn Fn(usize) -> EngineObservation,
}

impl<'a> InOrder<'a> {
    /// `holdings` in order, each read by `observe` (given its candidate index) when
    /// its run of equal work is reached.
    pub(super) fn new(
        mut holdings: Vec<Holding>,
        observe: &'a dyn Fn(usize) -> EngineObservation,
    ) -> Self {
        // Holders read deepest first come in this order already: a stable sort finds it
        // in one pass.
        holdings.sort_by_key(|h| h.uncached);
        Self {
            unread: holdings,
            next_unread: 0,
            read: Vec::new(),
            queue: VecDeque::new(),
            observe,
        }
    }

    /// Holders whose load was read already (every one weighed at once), in order;
    /// `observe` is never called.
    pub(super) fn of_read(
        mut read: Vec<Holder>,
        observe: &'a dyn Fn(usize) -> EngineObservation,
    ) -> Self {
        read.sort_by_cached_key(|h| (h.uncached, pressure_key(h), h.index));
        Self {
            unread: Vec::new(),
            next_unread: 0,
            queue: (0..read.len()).collect(),
            read,
            observe,
        }
    }

    /// From now on, the holders at `places` (among those read, in order) and no
    /// other: a second pass over some of them.
    pub(super) fn again(&mut self, places: Vec<usize>) {
        self.next_unread = self.unread.len();
        self.queue = places.into();
    }

    /// The uncached work of the next holder, without reading any load.
    pub(super) fn next_work(&self) -> Option<u64> {
        match self.queue.front() {
            Some(&place) => Some(self.read[place].uncached),
            None => self.unread.get(self.next_unread).map(|h| h.uncached),
        }
    }

    /// The place of the next holder, its run read first if it was not.
    pub(super) fn next(&mut self) -> Option<usize> {
        if self.queue.is_empty() {
            let work = self.unread.get(self.next_unread)?.uncached;
            let run = self.unread[self.next_unread..]
                .iter()
                .take_while(|h| h.uncached == work);
            let start = self.read.len();
            self.read
                .extend(run.map(|h| h.read((self.observe)(h.index))));
            self.next_unread += self.read.len() - start;
            self.read[start..].sort_by_cached_key(|h| (pressure_key(h), h.index));
            self.queue.extend(start..self.read.len());
        }
        self.queue.pop_front()
    }

    /// The holder at `place` among those read.
    pub(super) fn get(&self, place: usize) -> &Holder {
        &self.read[place]
    }
}

/// A holder's prefill pressure as a key, in increasing order: estimated queue time
/// (corrected by the dispatches its report has not seen, each taken to bring this
/// request's uncached tokens), waiting uncached tokens, waiting and running requests
/// (unknown values last), then router-local in-flight requests; the queue time as an
/// integer ordered as [`f64::total_cmp`] orders the float.
pub(super) fn pressure_key(h: &Holder) -> (i64, u64, u64, u64, u64) {
    let o = &h.observation;
    let report = o.reported.as_ref();
    let native = report.and_then(|r| r.native);
    let queue_ms = o
        .corrected_prefill_queue_ms(h.uncached)
        .unwrap_or(f64::INFINITY);
    (
        total_order_key(queue_ms),
        native.map_or(u64::MAX, |n| n.waiting_uncached_tokens),
        report.map_or(u64::MAX, |r| r.waiting_requests),
        report.map_or(u64::MAX, |r| r.running_requests),
        o.in_flight,
    )
}

/// An integer ordered as [`f64::total_cmp`] orders `x`: negative floats' magnitude
/// bits flipped, so they order below the positive ones and by value.
fn total_order_key(x: f64) -> i64 {
    let bits = x.to_bits().cast_signed();
    bits ^ ((bits >> 63).cast_unsigned() >> 1).cast_signed()
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use proptest::prelude::*;

    use super::*;

    fn holdings(work: &[u64]) -> Vec<Holding> {
        work.iter()
            .enumerate()
            .map(|(index, &uncached)| Holding {
                index,
                matched: 0,
                uncached,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn the_queue_key_orders_as_the_float_does(a: f64, b: f64, special in 0usize..6) {
            let specials = [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
            for (x, y) in [(a, b), (a, specials[special]), (specials[special], b)] {
                prop_assert_eq!(total_order_key(x).cmp(&total_order_key(y)), x.total_cmp(&y));
            }
        }

        #[test]
        fn holders_come_in_the_whole_order(
            holders in proptest::collection::vec((0u64..4, 0u64..3), 1..120),
        ) {
            // Few distinct values, so ties on work and pressure fall to the index.
            let in_flight = |index: usize| EngineObservation {
                in_flight: holders[index].1,
                ..EngineObservation::UNKNOWN
            };
            let work: Vec<u64> = holders.iter().map(|h| h.0).collect();
            let mut sorted: Vec<Holder> = holdings(&work)
                .into_iter()
                .map(|h| h.read(in_flight(h.index)))
                .collect();
            sorted.sort_by(|a, b| {
                a.uncached
                    .cmp(&b.uncached)
                    .then_with(|| pressure_key(a).cmp(&pressure_key(b)))
                    .then_with(|| a.index.cmp(&b.index))
            });
            let mut order = InOrder::new(holdings(&work), &in_flight);
            let mut taken = Vec::new();
            while let Some(place) = order.next() {
                taken.push(order.get(place).index);
            }
            prop_assert_eq!(taken, sorted.iter().map(|h| h.index).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_run_is_read_only_when_it_is_reached() {
        let reads = RefCell::new(Vec::new());
        let observe = |index: usize| {
            reads.borrow_mut().push(index);
            EngineObservation::UNKNOWN
        };
        let mut order = InOrder::new(holdings(&[30, 10, 20, 10]), &observe);
        let next = |order: &mut InOrder| order.next().map(|place| order.get(place).index);
        assert_eq!(order.next_work(), Some(10));
        assert!(reads.borrow().is_empty(), "peeking reads no load");
        assert_eq!(next(&mut order), Some(1));
        assert_eq!(*reads.borrow(), [1, 3], "the whole run of least work, only");
        assert_eq!(next(&mut order), Some(3));
        assert_eq!(order.next_work(), Some(20));
        assert_eq!(reads.borrow().len(), 2);
        assert_eq!(next(&mut order), Some(2));
        assert_eq!(next(&mut order), Some(0));
        assert_eq!(next(&mut order), None);
        assert_eq!(reads.borrow().len(), 4);
    }

    #[test]
    fn holders_read_already_are_taken_in_order_and_not_read_again() {
        let observe = |_: usize| -> EngineObservation { panic!("read again") };
        let busy = |in_flight| EngineObservation {
            in_flight,
            ..EngineObservation::UNKNOWN
        };
        let works = holdings(&[20, 10, 10]);
        let read = vec![
            works[0].read(busy(0)),
            works[1].read(busy(3)),
            works[2].read(busy(1)),
        ];
        let mut order = InOrder::of_read(read, &observe);
        assert_eq!(order.next_work(), Some(10));
        let mut indices = Vec::new();
        while let Some(place) = order.next() {
            indices.push(order.get(place).index);
        }
        assert_eq!(indices, [2, 1, 0], "least work, then least in flight");
    }

    #[test]
    fn a_second_pass_takes_the_places_given_and_reads_nothing_again() {
        let reads = RefCell::new(0);
        let observe = |_: usize| {
            *reads.borrow_mut() += 1;
            EngineObservation::UNKNOWN
        };
        let mut order = InOrder::new(holdings(&[5, 7, 9]), &observe);
        let first = order.next().expect("a holder");
        let second = order.next().expect("another");
        order.again(vec![first, second]);
        assert_eq!(order.next_work(), Some(5));
        let mut indices = Vec::new();
        while let Some(place) = order.next() {
            indices.push(order.get(place).index);
        }
        assert_eq!(indices, [0, 1], "not the unread third");
        assert_eq!(*reads.borrow(), 2);
    }
}
