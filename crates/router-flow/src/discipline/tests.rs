//! Concrete cases of the discipline: weighted shares, offered load, the starvation
//! bound, deadlines, capacity and clamping.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::{Discipline, Full};
use crate::settings::{DisciplineSettings, SettingsError};

fn weight(w: u32) -> NonZeroU32 {
    NonZeroU32::new(w).unwrap()
}

fn discipline<T>(bands: u8, starvation_limit: u32, capacity: usize) -> Discipline<T> {
    Discipline::new(DisciplineSettings {
        bands,
        starvation_limit,
        capacity,
    })
    .unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// Grants the first candidate `n` times and returns the items in grant order.
fn drain<T: Copy>(d: &mut Discipline<T>, n: usize) -> Vec<T> {
    let now = Instant::now();
    (0..n)
        .map(|_| {
            let id = d.candidates(now, 1)[0];
            d.grant(id, now).unwrap()
        })
        .collect()
}

#[test]
fn weights_three_to_one_share_three_quarters() {
    let mut d = discipline(1, 1, 1000);
    for _ in 0..400 {
        d.push(0, "a".into(), weight(3), 0, far(), 'a').unwrap();
        d.push(0, "b".into(), weight(1), 0, far(), 'b').unwrap();
    }
    let granted = drain(&mut d, 400);
    let a = granted.iter().filter(|&&t| t == 'a').count();
    assert!((296..=304).contains(&a), "a got {a} of 400");
}

#[test]
fn ten_times_the_load_gets_no_more_than_half() {
    let mut d = discipline(1, 1, 1100);
    for _ in 0..1000 {
        d.push(0, "heavy".into(), weight(1), 0, far(), 'h').unwrap();
    }
    for _ in 0..100 {
        d.push(0, "light".into(), weight(1), 0, far(), 'l').unwrap();
    }
    let granted = drain(&mut d, 200);
    let heavy = granted.iter().filter(|&&t| t == 'h').count();
    assert_eq!(heavy, 100);
}

#[test]
fn a_returning_tenant_does_not_catch_up_on_its_idle_time() {
    let mut d = discipline(1, 1, 100);
    for _ in 0..10 {
        d.push(0, "a".into(), weight(1), 0, far(), 'a').unwrap();
    }
    drain(&mut d, 5);
    for _ in 0..4 {
        d.push(0, "b".into(), weight(1), 0, far(), 'b').unwrap();
    }
    // b starts at the virtual clock (a's last start tag), not at zero: one step
    // ahead of a's next entry, then the two alternate.
    assert_eq!(drain(&mut d, 7), ['b', 'a', 'b', 'a', 'b', 'a', 'b']);
    assert_eq!(drain(&mut d, 2), ['a', 'a']);
}

#[test]
fn starvation_bound_with_three_bands() {
    let mut d = discipline(3, 2, 300);
    for band in 0..3u8 {
        for _ in 0..100 {
            d.push(band, "t".into(), weight(1), 0, far(), band).unwrap();
        }
    }
    let granted = drain(&mut d, 40);
    assert_eq!(granted[..8], [0, 0, 1, 2, 0, 0, 1, 2]);
    // Band 2 waits at most starvation_limit + 2 grants to higher bands.
    let mut gap = 0;
    for band in granted {
        if band == 2 {
            gap = 0;
        } else {
            gap += 1;
            assert!(gap <= 2 + 2);
        }
    }
}

#[test]
fn candidates_list_one_entry_of_each_kind_band_by_band() {
    let mut d = discipline(2, 8, 10);
    let (short, long, other) = (1, 2, 3);
    let a1 = d.push(0, "a".into(), weight(1), long, far(), ()).unwrap();
    let a2 = d.push(0, "a".into(), weight(1), long, far(), ()).unwrap();
    let a3 = d.push(0, "a".into(), weight(1), short, far(), ()).unwrap();
    let b1 = d.push(0, "b".into(), weight(1), short, far(), ()).unwrap();
    let _c1 = d.push(1, "c".into(), weight(1), long, far(), ()).unwrap();
    let c2 = d.push(1, "c".into(), weight(1), other, far(), ()).unwrap();
    let now = Instant::now();
    // Band 0: heads a1 (long) and b1 (short), then a's first entry of another kind
    // (a3, short: listed already through b1); band 1: c1 (long: listed already), then
    // c's first entry of another kind, c2.
    assert_eq!(d.candidates(now, 10), [a1, b1, c2]);
    assert_eq!(d.candidates(now, 2), [a1, b1]);
    // An alternative may be granted: b goes before a.
    assert_eq!(d.grant(b1, now), Some(()));
    assert_eq!(d.candidates(now, 10), [a1, a3, c2]);
    assert_eq!(d.grant(a3, now), Some(()));
    assert_eq!(d.candidates(now, 10), [a1, c2]);
    assert_eq!(d.grant(a1, now), Some(()));
    assert_eq!(d.candidates(now, 10), [a2, c2], "a2 is a's head now");
    assert_eq!((d.kind_len(long), d.kind_len(short)), (2, 0));
}

#[test]
fn a_head_that_cannot_be_served_does_not_hold_back_another_kind_behind_it() {
    let mut d = discipline(1, 1, 10);
    let now = Instant::now();
    let (short, long) = (1, 2);
    let stuck = d.push(0, "a".into(), weight(1), long, far(), 1).unwrap();
    let _same = d.push(0, "a".into(), weight(1), long, far(), 2).unwrap();
    let other = d.push(0, "a".into(), weight(1), short, far(), 3).unwrap();
    let last = d.push(0, "a".into(), weight(1), short, far(), 4).unwrap();
    assert_eq!(
        d.candidates(now, 8),
        [stuck, other],
        "one entry of each kind, each kind's first"
    );
    assert_eq!(d.grant(other, now), Some(3), "the other kind is served");
    assert_eq!(
        d.candidates(now, 8),
        [stuck, last],
        "the head keeps its place"
    );
}

#[test]
fn a_starved_band_goes_first_even_behind_another_starved_band_that_cannot_be_served() {
    let mut d = discipline(3, 1, 10);
    let now = Instant::now();
    let (served, stuck) = (1, 2);
    let urgent = d.push(0, "t".into(), weight(1), served, far(), 0).unwrap();
    let _urgent2 = d.push(0, "t".into(), weight(1), served, far(), 0).unwrap();
    let middle = d.push(1, "t".into(), weight(1), stuck, far(), 1).unwrap();
    let low = d.push(2, "t".into(), weight(1), served, far(), 2).unwrap();
    assert_eq!(d.candidates(now, 8), [urgent, middle]);
    assert_eq!(d.grant(urgent, now), Some(0));
    // Bands 1 and 2 are both starved now: both go before band 0, in priority order,
    // and band 2's entry is listed although band 0 has one of its kind.
    assert_eq!(d.candidates(now, 8)[..2], [middle, low]);
}

#[test]
fn only_live_entries_are_listed_or_granted() {
    let mut d = discipline(1, 1, 10);
    let now = Instant::now();
    let soon = now + Duration::from_secs(1);
    let first = d.push(0, "a".into(), weight(1), 0, soon, 1).unwrap();
    let second = d.push(0, "a".into(), weight(1), 0, far(), 2).unwrap();
    assert_eq!(d.candidates(now, 10), [first], "one entry of the kind");
    assert_eq!(
        d.grant(second, now),
        Some(2),
        "any live entry can be granted"
    );
    let second = d.push(0, "a".into(), weight(1), 0, far(), 2).unwrap();
    // Past the first entry's deadline, the second counts as the head.
    let later = soon;
    assert_eq!(d.candidates(later, 10), [second]);
    assert_eq!(d.grant(first, later), None);
    assert_eq!(d.len(), 2);
    assert_eq!(d.grant(second, later), Some(2));
    assert_eq!(d.remove(first), Some(1));
    assert!(d.is_empty());
}

#[test]
fn full_gives_the_item_back() {
    let mut d = discipline(1, 1, 2);
    d.push(0, "a".into(), weight(1), 0, far(), 1).unwrap();
    d.push(0, "a".into(), weight(1), 0, far(), 2).unwrap();
    let Err(Full(back)) = d.push(0, "a".into(), weight(1), 0, far(), 3) else {
        panic!("a third push into a capacity of 2 must be refused");
    };
    assert_eq!(back, 3);
    assert_eq!(d.len(), 2);
}

#[test]
fn out_of_range_band_and_weight_are_clamped() {
    let mut d = discipline(2, 1, 10);
    d.push(7, "a".into(), weight(u32::MAX), 0, far(), 'a')
        .unwrap();
    d.push(1, "b".into(), weight(1000), 0, far(), 'b').unwrap();
    assert_eq!(d.band_len(1), 2);
    assert_eq!(d.band_len(7), 0);
    // Both weights count as 1000: equal share, a first by arrival.
    d.push(1, "a".into(), weight(u32::MAX), 0, far(), 'a')
        .unwrap();
    d.push(1, "b".into(), weight(1000), 0, far(), 'b').unwrap();
    assert_eq!(drain(&mut d, 4), ['a', 'b', 'a', 'b']);
}

#[test]
fn settings_out_of_range_are_refused() {
    let ok = DisciplineSettings {
        bands: 8,
        starvation_limit: 1,
        capacity: 1,
    };
    assert!(Discipline::<()>::new(ok).is_ok());
    let cases = [
        (
            DisciplineSettings { bands: 0, ..ok },
            SettingsError::Bands(0),
        ),
        (
            DisciplineSettings { bands: 9, ..ok },
            SettingsError::Bands(9),
        ),
        (
            DisciplineSettings {
                starvation_limit: 0,
                ..ok
            },
            SettingsError::StarvationLimit,
        ),
        (
            DisciplineSettings { capacity: 0, ..ok },
            SettingsError::Capacity,
        ),
    ];
    for (settings, error) in cases {
        assert_eq!(Discipline::<()>::new(settings).unwrap_err(), error);
    }
}

#[test]
fn a_band_remembers_at_most_capacity_idle_tenants() {
    let mut d = discipline(1, 1, 2);
    let now = Instant::now();
    for tenant in ["a", "b", "c"] {
        let id = d
            .push(0, tenant.into(), weight(1), 0, far(), tenant)
            .unwrap();
        d.grant(id, now).unwrap();
    }
    // Three idle tenants are one step ahead of the clock; the band keeps two, and
    // forgets a (the least ahead, first by name). b returns one step ahead, a at the
    // clock, so a goes first although b arrived first.
    d.push(0, "b".into(), weight(1), 0, far(), "b").unwrap();
    d.push(0, "a".into(), weight(1), 0, far(), "a").unwrap();
    assert_eq!(drain(&mut d, 2), ["a", "b"]);
}
