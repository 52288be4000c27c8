//! The waiting room with paused time (current-thread runtime) and under real
//! concurrency (multi-thread runtime, synchronised by channels and semaphores).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::advance;

use super::{Refused, WaitingRoom};
use crate::room::Expired;
use crate::settings::{DisciplineSettings, RoomSettings, SettingsError};

fn room(bands: u8, capacity: usize, max_wait: Duration, tries_per_pass: usize) -> Arc<WaitingRoom> {
    WaitingRoom::new(RoomSettings {
        max_wait,
        discipline: DisciplineSettings {
            bands,
            starvation_limit: 4,
            capacity,
        },
        tries_per_pass,
    })
    .unwrap()
}

fn one() -> NonZeroU32 {
    NonZeroU32::MIN
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn the_turn_follows_the_discipline() {
    let room = room(2, 16, MINUTE, 8);
    let mut a1 = room.enter(1, "a".into(), one(), 1).unwrap();
    // Entering an idle room starts a pass: a1 holds the turn at once.
    a1.turn().await.unwrap();
    let mut b1 = room.enter(0, "b".into(), one(), 2).unwrap();
    let mut b2 = room.enter(0, "b".into(), one(), 2).unwrap();
    let mut c1 = room.enter(0, "c".into(), one(), 3).unwrap();
    assert!(!b1.holds_turn());
    a1.failed();
    // b and c came during the pass, of kinds nothing waiting had: a pass follows, in
    // the discipline's order (band 0 in fair order, then band 1).
    b1.turn().await.unwrap();
    b1.failed();
    c1.turn().await.unwrap();
    c1.failed();
    a1.turn().await.unwrap();
    a1.failed();
    // No capacity event came since: the room waits.
    assert!(!a1.holds_turn() && !b1.holds_turn() && !c1.holds_turn());

    // A pass offers the turn to one entry of each kind (here, each tenant's): band 0
    // in fair order, then band 1.
    room.capacity_freed();
    b1.turn().await.unwrap();
    b1.failed();
    c1.turn().await.unwrap();
    assert!(!b2.holds_turn());
    c1.failed();
    a1.turn().await.unwrap();
    a1.failed();
    assert!(!b1.holds_turn() && !c1.holds_turn() && !a1.holds_turn() && !b2.holds_turn());

    room.capacity_freed();
    b1.turn().await.unwrap();
    b1.admitted();
    // b was charged: c goes before b's next entry, and a new pass started at once.
    c1.turn().await.unwrap();
    c1.failed();
    b2.turn().await.unwrap();
    b2.admitted();
    c1.turn().await.unwrap();
    c1.admitted();
    a1.turn().await.unwrap();
    a1.admitted();
    assert!(room.is_empty());
}

// A request of a kind nothing else waiting has, entering while a pass is in progress,
// gets a pass of its own after it: the pass may have tried only kinds that cannot be
// served. One of a kind already waiting does not.
#[tokio::test(start_paused = true)]
async fn a_new_kind_arriving_during_a_pass_gets_a_pass() {
    let room = room(1, 16, MINUTE, 8);
    let mut stuck = room.enter(0, "t".into(), one(), 1).unwrap();
    stuck.turn().await.unwrap();
    let same = room.enter(0, "t".into(), one(), 1).unwrap();
    let mut other = room.enter(0, "t".into(), one(), 2).unwrap();
    stuck.failed();
    // The pass that follows offers the head of each kind: stuck first, then other.
    stuck.turn().await.unwrap();
    stuck.failed();
    other.turn().await.unwrap();
    other.failed();
    assert!(!stuck.holds_turn() && !same.holds_turn() && !other.holds_turn());
    let mut again = room.enter(0, "t".into(), one(), 2).unwrap();
    assert!(!again.holds_turn(), "a kind already waiting starts no pass");
    room.capacity_freed();
    stuck.turn().await.unwrap();
    stuck.failed();
    other.turn().await.unwrap();
    other.admitted();
    stuck.turn().await.unwrap();
    stuck.failed();
    again.turn().await.unwrap();
    again.admitted();
}

#[tokio::test(start_paused = true)]
async fn a_pass_tries_at_most_tries_per_pass_waiters() {
    let room = room(1, 16, MINUTE, 2);
    let mut a = room.enter(0, "a".into(), one(), 1).unwrap();
    a.turn().await.unwrap();
    a.failed();
    let mut b = room.enter(0, "b".into(), one(), 2).unwrap();
    // b's entry started a pass of [a, b]; c's, of a third kind, one more after it.
    let c = room.enter(0, "c".into(), one(), 3).unwrap();
    for _ in 0..2 {
        a.turn().await.unwrap();
        a.failed();
        b.turn().await.unwrap();
        b.failed();
    }
    assert!(!c.holds_turn() && !a.holds_turn() && !b.holds_turn());
}

#[tokio::test(start_paused = true)]
async fn a_capacity_event_wakes_the_head_again() {
    let room = room(1, 16, MINUTE, 8);
    let mut ticket = room.enter(0, "a".into(), one(), 1).unwrap();
    ticket.turn().await.unwrap();
    ticket.failed();
    let waiter = tokio::spawn(async move { ticket.turn().await.map(|()| ticket) });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    room.capacity_freed();
    let ticket = waiter.await.unwrap().unwrap();
    assert!(ticket.holds_turn());
}

#[tokio::test(start_paused = true)]
async fn an_event_during_a_pass_starts_another() {
    let room = room(1, 16, MINUTE, 8);
    let mut ticket = room.enter(0, "a".into(), one(), 1).unwrap();
    ticket.turn().await.unwrap();
    room.capacity_freed();
    ticket.failed();
    // The event came while the pass was in progress: a new pass followed it.
    assert!(ticket.holds_turn());
    ticket.failed();
    assert!(!ticket.holds_turn());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_holder_passes_the_turn_on() {
    let room = room(1, 16, MINUTE, 8);
    let holder = room.enter(0, "a".into(), one(), 1).unwrap();
    let mut next = room.enter(0, "b".into(), one(), 2).unwrap();
    room.capacity_freed();
    assert!(holder.holds_turn());
    // A wait given up on (the future dropped) leaves the ticket queued.
    let gave_up = tokio::time::timeout(Duration::from_secs(1), next.turn()).await;
    assert!(gave_up.is_err());
    assert_eq!(room.depth(), [2]);
    let waiter = tokio::spawn(async move { next.turn().await.map(|()| next) });
    tokio::task::yield_now().await;
    drop(holder);
    let next = waiter.await.unwrap().unwrap();
    assert!(next.holds_turn());
    assert_eq!(room.depth(), [1]);
    drop(next);
    assert!(room.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_that_is_not_the_holder_leaves_at_once() {
    let room = room(1, 16, MINUTE, 8);
    let holder = room.enter(0, "a".into(), one(), 1).unwrap();
    let waiter = room.enter(0, "a".into(), one(), 1).unwrap();
    assert_eq!(room.depth(), [2]);
    drop(waiter);
    assert_eq!(room.depth(), [1]);
    assert!(holder.holds_turn());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_expires_the_entry() {
    let room = room(1, 16, Duration::from_secs(5), 8);
    let mut holder = room.enter(0, "a".into(), one(), 1).unwrap();
    advance(Duration::from_secs(1)).await;
    let mut waiter = room.enter(0, "b".into(), one(), 2).unwrap();
    room.capacity_freed();
    // The holder's deadline passes while it holds the turn: it expires and the
    // capacity event that came meanwhile gives the turn to the waiter.
    holder.turn().await.unwrap();
    advance(Duration::from_secs(4)).await;
    let expired = holder.turn().await.unwrap_err();
    assert_eq!(expired.waited, Duration::from_secs(5));
    assert_eq!(room.depth(), [1]);
    waiter.turn().await.unwrap();
    waiter.failed();
    // Nobody is left to give the turn to: the waiter waits out its deadline.
    let expired = waiter.turn().await.unwrap_err();
    assert_eq!(
        expired,
        Expired {
            retry_after: Duration::from_secs(5),
            waited: Duration::from_secs(5)
        }
    );
    assert!(room.is_empty());
    // Expired stays expired.
    assert!(waiter.turn().await.is_err());
    assert_eq!(waiter.admitted(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn capacity_freed_on_an_empty_room_takes_no_lock() {
    let room = room(2, 16, MINUTE, 8);
    {
        // Holding the room's lock: a capacity event on the empty room must not wait
        // for it.
        let _held = room.state.lock();
        room.capacity_freed();
    }
    assert!(room.is_empty());
    assert_eq!(room.depth(), [0, 0]);
    let ticket = room.enter(1, "a".into(), one(), 1).unwrap();
    assert!(ticket.holds_turn());
    assert_eq!(room.depth(), [0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_full_room_refuses_with_a_retry_hint() {
    let room = room(1, 2, Duration::from_millis(2500), 8);
    let _a = room.enter(0, "a".into(), one(), 1).unwrap();
    let _b = room.enter(0, "b".into(), one(), 2).unwrap();
    let refused = room.enter(0, "c".into(), one(), 3).unwrap_err();
    assert_eq!(
        refused,
        Refused::Full {
            retry_after: Duration::from_secs(3)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_follows_the_drain_rate() {
    let room = room(1, 100, Duration::from_millis(300), 8);
    assert_eq!(room.retry_after(), Duration::from_secs(1));
    let room = WaitingRoom::new(RoomSettings {
        max_wait: Duration::from_secs(600),
        ..*room.settings()
    })
    .unwrap();
    assert_eq!(room.retry_after(), Duration::from_secs(60));
    let mut tickets: Vec<_> = (0..10)
        .map(|_| room.enter(0, "a".into(), one(), 1).unwrap())
        .collect();
    tickets.reverse();
    for _ in 0..4 {
        advance(Duration::from_secs(2)).await;
        let mut head = tickets.pop().unwrap();
        head.turn().await.unwrap();
        head.admitted();
    }
    // One grant every 2 s, 6 waiting: 12 s.
    assert_eq!(room.retry_after(), Duration::from_secs(12));
    let more: Vec<_> = (0..30)
        .map(|_| room.enter(0, "b".into(), one(), 2).unwrap())
        .collect();
    assert_eq!(room.retry_after(), Duration::from_secs(60));
    drop((tickets, more));
}

#[test]
fn settings_out_of_range_are_refused() {
    let ok = RoomSettings::default();
    let zero_wait = RoomSettings {
        max_wait: Duration::ZERO,
        ..ok
    };
    let too_long = RoomSettings {
        max_wait: Duration::MAX,
        ..ok
    };
    let no_tries = RoomSettings {
        tries_per_pass: 0,
        ..ok
    };
    let no_bands = RoomSettings {
        discipline: DisciplineSettings {
            bands: 0,
            ..ok.discipline
        },
        ..ok
    };
    assert!(WaitingRoom::new(ok).is_ok());
    assert_eq!(
        WaitingRoom::new(zero_wait).unwrap_err(),
        SettingsError::MaxWait
    );
    assert_eq!(
        WaitingRoom::new(too_long).unwrap_err(),
        SettingsError::MaxWait
    );
    assert_eq!(
        WaitingRoom::new(no_tries).unwrap_err(),
        SettingsError::TriesPerPass
    );
    assert_eq!(
        WaitingRoom::new(no_bands).unwrap_err(),
        SettingsError::Bands(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_drains_in_order_as_slots_free() {
    const WAITERS: usize = 48;
    const SLOTS: usize = 4;
    let room = room(1, WAITERS, Duration::from_secs(3600), 8);
    let pool = Arc::new(Semaphore::new(SLOTS));
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (done, mut admissions) = mpsc::unbounded_channel();
    let tickets: Vec<_> = (0..WAITERS)
        .map(|_| room.enter(0, "t".into(), one(), 0).unwrap())
        .collect();
    for (i, mut ticket) in tickets.into_iter().enumerate() {
        let (pool, order, done) = (Arc::clone(&pool), Arc::clone(&order), done.clone());
        tokio::spawn(async move {
            loop {
                ticket.turn().await.unwrap();
                if let Ok(permit) = pool.try_acquire() {
                    permit.forget();
                    // Only the holder tries, so the log is in admission order.
                    order.lock().push(i);
                    ticket.admitted();
                    done.send(()).unwrap();
                    return;
                }
                ticket.failed();
            }
        });
    }
    for _ in 0..SLOTS {
        admissions.recv().await.unwrap();
    }
    for _ in SLOTS..WAITERS {
        pool.add_permits(1);
        room.capacity_freed();
        admissions.recv().await.unwrap();
    }
    assert_eq!(*order.lock(), (0..WAITERS).collect::<Vec<_>>());
    assert!(room.is_empty());
    assert_eq!(pool.available_permits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waiters_of_many_tenants_are_all_served_once() {
    const WAITERS: usize = 64;
    let room = room(3, WAITERS, Duration::from_secs(3600), 4);
    let pool = Arc::new(Semaphore::new(0));
    let (done, mut admissions) = mpsc::unbounded_channel();
    for i in 0..WAITERS {
        let (room, pool, done) = (Arc::clone(&room), Arc::clone(&pool), done.clone());
        tokio::spawn(async move {
            let band = u8::try_from(i % 3).unwrap();
            let tenant: Arc<str> = format!("tenant-{}", i % 5).into();
            let mut ticket = room.enter(band, tenant, one(), 0).unwrap();
            loop {
                ticket.turn().await.unwrap();
                if let Ok(permit) = pool.try_acquire() {
                    ticket.admitted();
                    done.send(i).unwrap();
                    // Hold the slot until the driver frees the next one.
                    permit.forget();
                    return;
                }
                ticket.failed();
            }
        });
    }
    let mut served = [false; WAITERS];
    for _ in 0..WAITERS {
        pool.add_permits(1);
        room.capacity_freed();
        let i = admissions.recv().await.unwrap();
        assert!(!served[i]);
        served[i] = true;
    }
    assert!(served.iter().all(|s| *s));
    assert!(room.is_empty());
}
