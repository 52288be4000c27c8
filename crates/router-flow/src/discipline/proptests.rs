//! Property tests: the discipline against the plain model of its rules
//! ([`Reference`]), and the fairness and starvation bounds.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::band::SCALE;
use super::reference::Reference;
use super::{Discipline, EntryId, Full};
use crate::settings::DisciplineSettings;

const TENANTS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
enum Op {
    Push {
        band: u8,
        tenant: usize,
        weight: u32,
        kind: u64,
        ttl: u64,
    },
    Remove {
        pick: usize,
    },
    Grant {
        k: usize,
    },
    GrantAny {
        pick: usize,
    },
    Advance {
        ticks: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4u8, 0..TENANTS.len(), 1..=4u32, 0..3u64, 1..40u64)
            .prop_map(|(band, tenant, weight, kind, ttl)| Op::Push { band, tenant, weight, kind, ttl }),
        1 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
        3 => (0..4usize).prop_map(|k| Op::Grant { k }),
        1 => any::<usize>().prop_map(|pick| Op::GrantAny { pick }),
        1 => (0..12u64).prop_map(|ticks| Op::Advance { ticks }),
    ]
}

/// What became of a pushed item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Queued,
    Granted,
    Removed,
}

/// A queued entry as the test saw it pushed.
#[derive(Debug, Clone)]
struct Pushed {
    id: EntryId,
    band: u8,
    tenant: usize,
    kind: u64,
    deadline: Instant,
}

fn tick(base: Instant, ticks: u64) -> Instant {
    base + Duration::from_millis(ticks)
}

fn settings() -> impl Strategy<Value = DisciplineSettings> {
    (1..=3u8, 1..=3u32, 1..=6usize).prop_map(|(bands, starvation_limit, capacity)| {
        DisciplineSettings {
            bands,
            starvation_limit,
            capacity,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Random pushes, removals, grants and time: the discipline lists and grants
    /// exactly what the plain rules say, loses nothing, never serves an expired entry,
    /// never offers an entry before an earlier live one of its tenant, band and kind,
    /// and offers one entry of each kind.
    #[test]
    fn agrees_with_the_plain_rules(settings in settings(), ops in proptest::collection::vec(op(), 1..120)) {
        let base = Instant::now();
        let mut now = base;
        let mut d: Discipline<usize> = Discipline::new(settings).unwrap();
        let mut r = Reference::new(settings.bands, settings.starvation_limit, settings.capacity);
        let mut fates: Vec<Fate> = Vec::new();
        let mut queued: Vec<Pushed> = Vec::new();
        let mut by_seq: HashMap<EntryId, usize> = HashMap::new();

        for op in ops {
            match op {
                Op::Push { band, tenant, weight, kind, ttl } => {
                    let item = fates.len();
                    let deadline = tick(now, ttl);
                    let w = NonZeroU32::new(weight).unwrap();
                    let ours = d.push(band, TENANTS[tenant].into(), w, kind, deadline, item);
                    let theirs = r.push(band, TENANTS[tenant], weight, kind, deadline);
                    match (ours, theirs) {
                        (Ok(id), Some(seq)) => {
                            prop_assert_eq!(id, EntryId(seq));
                            fates.push(Fate::Queued);
                            by_seq.insert(id, item);
                            let band = band.min(settings.bands - 1);
                            queued.push(Pushed { id, band, tenant, kind, deadline });
                        }
                        (Err(Full(back)), None) => {
                            prop_assert_eq!(back, item);
                            prop_assert_eq!(d.len(), settings.capacity);
                        }
                        (ours, theirs) => prop_assert!(false, "push: {:?} vs {:?}", ours.map_err(|f| f.0), theirs),
                    }
                }
                Op::Remove { pick } => {
                    if queued.is_empty() { continue; }
                    let p = queued.remove(pick % queued.len());
                    prop_assert!(r.remove(p.id.0));
                    let item = d.remove(p.id);
                    prop_assert_eq!(item, Some(by_seq[&p.id]));
                    fates[by_seq[&p.id]] = Fate::Removed;
                    prop_assert_eq!(d.remove(p.id), None);
                }
                Op::Grant { k } => {
                    let list = d.candidates(now, 16);
                    let Some(&id) = list.get(k) else { continue; };
                    let p = queued.iter().position(|p| p.id == id).unwrap();
                    let p = queued.remove(p);
                    // Arrival order within tenant, band and kind: nothing earlier of
                    // the same tenant, band and kind is still live.
                    prop_assert!(!queued.iter().any(|q| q.band == p.band && q.tenant == p.tenant && q.kind == p.kind && q.id < p.id && q.deadline > now));
                    // One entry of each kind is offered.
                    let kinds: Vec<u64> = list.iter().map(|c| queued.iter().chain([&p]).find(|q| q.id == *c).unwrap().kind).collect();
                    prop_assert!(kinds.iter().enumerate().all(|(i, k)| !kinds[..i].contains(k)));
                    prop_assert!(p.deadline > now);
                    prop_assert!(r.grant(id.0, now));
                    prop_assert_eq!(d.grant(id, now), Some(by_seq[&id]));
                    fates[by_seq[&id]] = Fate::Granted;
                }
                Op::GrantAny { pick } => {
                    if queued.is_empty() { continue; }
                    let i = pick % queued.len();
                    let id = queued[i].id;
                    let theirs = r.grant(id.0, now);
                    let ours = d.grant(id, now);
                    prop_assert_eq!(ours.is_some(), theirs);
                    prop_assert_eq!(theirs, queued[i].deadline > now, "any live entry can be granted");
                    if theirs {
                        prop_assert!(queued[i].deadline > now);
                        fates[by_seq[&id]] = Fate::Granted;
                        queued.remove(i);
                    }
                }
                Op::Advance { ticks } => now = tick(now, ticks),
            }

            let ours: Vec<u64> = d.candidates(now, usize::MAX).into_iter().map(|id| id.0).collect();
            prop_assert_eq!(&ours, &r.candidates(now, usize::MAX));
            let short: Vec<u64> = d.candidates(now, 2).into_iter().map(|id| id.0).collect();
            prop_assert_eq!(short, r.candidates(now, 2));
            for id in &ours {
                prop_assert!(queued.iter().any(|p| p.id.0 == *id && p.deadline > now));
            }
            prop_assert_eq!(d.len(), queued.len());
            prop_assert_eq!(d.is_empty(), queued.is_empty());
            for band in 0..settings.bands {
                prop_assert_eq!(d.band_len(band), r.band_len(usize::from(band)));
            }
        }

        let still = fates.iter().filter(|f| **f == Fate::Queued).count();
        prop_assert_eq!(still, d.len());
        for p in &queued {
            prop_assert_eq!(fates[by_seq[&p.id]], Fate::Queued);
            prop_assert_eq!(d.remove(p.id), Some(by_seq[&p.id]));
        }
        prop_assert!(d.is_empty());
    }

    /// Continuously backlogged tenants of one band: after every grant, any two
    /// tenants' services scaled by their quanta differ by at most one quantum.
    #[test]
    fn backlogged_tenants_share_by_weight(
        weights in proptest::collection::vec(1..=4u32, 2..=3),
        backlog in proptest::collection::vec(1..=5usize, 3),
        grants in 1..200usize,
    ) {
        let far = Instant::now() + Duration::from_secs(3600);
        let settings = DisciplineSettings { bands: 1, starvation_limit: 1, capacity: 64 };
        let mut d: Discipline<usize> = Discipline::new(settings).unwrap();
        for (t, &w) in weights.iter().enumerate() {
            for _ in 0..backlog[t] {
                d.push(0, TENANTS[t].into(), NonZeroU32::new(w).unwrap(), 0, far, t).unwrap();
            }
        }
        let quantum: Vec<u64> = weights.iter().map(|&w| SCALE / u64::from(w)).collect();
        let mut served = vec![0u64; weights.len()];
        let now = Instant::now();
        for _ in 0..grants {
            let id = d.candidates(now, 1)[0];
            let t = d.grant(id, now).unwrap();
            served[t] += 1;
            d.push(0, TENANTS[t].into(), NonZeroU32::new(weights[t]).unwrap(), 0, far, t).unwrap();
            for a in 0..weights.len() {
                for b in 0..weights.len() {
                    let gap = (served[a] * quantum[a]).abs_diff(served[b] * quantum[b]);
                    prop_assert!(gap <= quantum[a].max(quantum[b]), "served {:?} weights {:?}", served, weights);
                }
            }
        }
    }

    /// Every grant takes the first candidate: while a band stays non-empty, at most
    /// `starvation_limit + band` grants to higher-priority bands come between its
    /// grants (or before its first).
    #[test]
    fn starvation_is_bounded(
        bands in 2..=4u8,
        limit in 1..=3u32,
        ops in proptest::collection::vec((any::<bool>(), 0..4u8), 1..200),
    ) {
        let far = Instant::now() + Duration::from_secs(3600);
        let settings = DisciplineSettings { bands, starvation_limit: limit, capacity: 32 };
        let mut d: Discipline<u8> = Discipline::new(settings).unwrap();
        let mut waited = vec![0u32; usize::from(bands)];
        let now = Instant::now();
        for (push, band) in ops {
            let band = band.min(bands - 1);
            if push {
                let _ = d.push(band, "t".into(), NonZeroU32::MIN, 0, far, band);
                continue;
            }
            let Some(&id) = d.candidates(now, 1).first() else { continue; };
            let g = d.grant(id, now).unwrap();
            waited[usize::from(g)] = 0;
            for b in g + 1..bands {
                if d.band_len(b) > 0 {
                    waited[usize::from(b)] += 1;
                    prop_assert!(waited[usize::from(b)] <= limit + u32::from(b));
                } else {
                    waited[usize::from(b)] = 0;
                }
            }
        }
    }

    /// Entries of two kinds in several bands; at each grant only some kinds can be
    /// served, and the grant takes the first candidate of a kind that can. While a
    /// band holds an entry of a kind that can be served, at most
    /// `starvation_limit + band` grants in a row go to more urgent bands.
    #[test]
    fn starvation_is_bounded_when_some_kinds_cannot_be_served(
        bands in 2..=4u8,
        limit in 1..=3u32,
        ops in proptest::collection::vec((any::<bool>(), 0..4u8, 0..2u64, 0..3u8), 1..300),
    ) {
        let far = Instant::now() + Duration::from_secs(3600);
        let settings = DisciplineSettings { bands, starvation_limit: limit, capacity: 32 };
        let mut d: Discipline<(u8, u64)> = Discipline::new(settings).unwrap();
        let mut queued: Vec<(EntryId, u8, u64)> = Vec::new();
        let mut streak = vec![0u32; usize::from(bands)];
        let now = Instant::now();
        for (push, band, kind, servable) in ops {
            let band = band.min(bands - 1);
            if push {
                if let Ok(id) = d.push(band, "t".into(), NonZeroU32::MIN, kind, far, (band, kind)) {
                    queued.push((id, band, kind));
                }
                continue;
            }
            // 0: only kind 0 can be served, 1: only kind 1, 2: both.
            let can = |k: u64| servable == 2 || u64::from(servable) == k;
            let list = d.candidates(now, usize::MAX);
            let Some(&id) = list.iter().find(|id| can(d.get(**id).unwrap().1)) else { continue; };
            let (g, _) = d.grant(id, now).unwrap();
            let waiting: Vec<bool> = (0..bands)
                .map(|b| queued.iter().any(|&(q, qb, qk)| q != id && qb == b && can(qk)))
                .collect();
            queued.retain(|&(q, _, _)| q != id);
            streak[usize::from(g)] = 0;
            for b in g + 1..bands {
                if waiting[usize::from(b)] {
                    streak[usize::from(b)] += 1;
                    prop_assert!(streak[usize::from(b)] <= limit + u32::from(b), "band {} waited {}", b, streak[usize::from(b)]);
                } else {
                    streak[usize::from(b)] = 0;
                }
            }
        }
    }
}
