//! A closed loop: a fixed number of clients, each sending its next request as soon as
//! its previous one completed, with no think time.
//!
//! The trace's arrival times are ignored; its order is kept: an idle client takes the
//! earliest request not yet sent whose session has nothing in flight, so a session's
//! requests go one at a time, in trace order, and one busy session does not hold up
//! the others. Requests without a session never wait for one another. The replay
//! runs it on its virtual clock (`Arrivals::Closed`); `switchyard drive` over HTTP.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::trace::TraceRequest;

/// The most clients a closed loop runs.
pub const MAX_CLIENTS: usize = 1 << 16;

/// Which request each client of a closed loop sends next.
///
/// ```
/// use router_replay::{ClosedLoop, Segment, TraceRequest};
///
/// let request = |session: &str| TraceRequest {
///     at_us: 0,
///     model: None,
///     session: Some(session.into()),
///     prompt: vec![Segment::Named { id: "p".into(), tokens: 16 }],
///     output_tokens: 1,
/// };
/// let trace = [request("a"), request("a"), request("b")];
/// let mut clients = ClosedLoop::new(&trace, 2);
/// // Two clients: the first request, then the third (the second waits for the first).
/// assert_eq!((clients.send(), clients.send(), clients.send()), (Some(0), Some(2), None));
/// clients.completed(0);
/// assert_eq!(clients.send(), Some(1));
/// clients.completed(1);
/// clients.completed(2);
/// assert!(clients.done());
/// ```
#[derive(Debug)]
pub struct ClosedLoop<'a> {
    trace: &'a [TraceRequest],
    /// Clients with nothing in flight.
    idle: usize,
    /// Requests sent and not completed.
    in_flight: usize,
    /// The first request the scan has not reached.
    cursor: usize,
    /// Requests the scan passed whose session is now free: each its session's next.
    ready: BTreeSet<usize>,
    /// Sessions with a request in flight or ready, and their requests the scan passed
    /// that wait behind it, in trace order.
    sessions: HashMap<&'a str, VecDeque<usize>>,
}

impl<'a> ClosedLoop<'a> {
    /// `clients` clients, all idle, over `trace`.
    pub fn new(trace: &'a [TraceRequest], clients: usize) -> Self {
        Self {
            trace,
            idle: clients,
            in_flight: 0,
            cursor: 0,
            ready: BTreeSet::new(),
            sessions: HashMap::new(),
        }
    }

    /// The request an idle client sends now, by index in the trace, if a client is
    /// idle and a request can go: the earliest not sent whose session has nothing in
    /// flight.
    pub fn send(&mut self) -> Option<usize> {
        if self.idle == 0 {
            return None;
        }
        // Every ready request comes before the cursor.
        let index = match self.ready.pop_first() {
            Some(index) => index,
            None => self.scan()?,
        };
        self.idle -= 1;
        self.in_flight += 1;
        Some(index)
    }

    /// The first request from the cursor whose session is free, the session claimed;
    /// those passed wait behind their sessions.
    fn scan(&mut self) -> Option<usize> {
        while let Some(request) = self.trace.get(self.cursor) {
            let index = self.cursor;
            self.cursor += 1;
            let Some(session) = request.session.as_deref() else {
                return Some(index);
            };
            match self.sessions.get_mut(session) {
                Some(waiting) => waiting.push_back(index),
                None => {
                    self.sessions.insert(session, VecDeque::new());
                    return Some(index);
                }
            }
        }
        None
    }

    /// The request at `index`, sent, completed (answered, refused or failed): its
    /// client is idle again and its session's next request can go.
    ///
    /// # Panics
    /// When no request is in flight.
    pub fn completed(&mut self, index: usize) {
        assert!(self.in_flight > 0, "a request completed that was not sent");
        self.in_flight -= 1;
        self.idle += 1;
        if let Some(session) = self.trace[index].session.as_deref()
            && let Some(waiting) = self.sessions.get_mut(session)
        {
            match waiting.pop_front() {
                Some(next) => {
                    self.ready.insert(next);
                }
                None => {
                    self.sessions.remove(session);
                }
            }
        }
    }

    /// Whether every request was sent and completed.
    pub fn done(&self) -> bool {
        self.in_flight == 0 && self.ready.is_empty() && self.cursor == self.trace.len()
    }
}
