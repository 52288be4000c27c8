//! A streamed answer: its SSE events in order (a chat's role first, the words, the
//! finish, the usage when asked, `[DONE]`), held or cut as the faults say.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;

use super::generation::Generation;
use crate::server::visits::Visit;

enum Step {
    Role,
    Words,
    Finish,
    Usage,
    Done,
    End,
}

struct StreamState {
    generation: Generation,
    step: Step,
    include_usage: bool,
    sent: u32,
    /// Taken when the engine ends the stream itself; dropped with the stream before
    /// that, the request was abandoned.
    visit: Option<Visit>,
}

impl StreamState {
    async fn next_event(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let faults = self.generation.faults();
        faults.hold(self.sent).await;
        let disconnect_after = faults.current().disconnect_after_chunks;
        if disconnect_after.is_some_and(|n| self.sent >= n) {
            // Let the server flush what was sent before the connection is cut.
            tokio::task::yield_now().await;
            if let Some(visit) = self.visit.take() {
                visit.answered();
            }
            return Some(Err(std::io::Error::other("simulated disconnect")));
        }
        let g = &mut self.generation;
        let event = loop {
            match self.step {
                Step::Role => {
                    g.prefill().await;
                    self.step = Step::Words;
                    // A text completion's stream has no role event.
                    if let Some(event) = g.role_event() {
                        break event;
                    }
                }
                Step::Words => match g.next_word().await {
                    Some(word) => break g.word_event(word),
                    None => self.step = Step::Finish,
                },
                Step::Finish => {
                    self.step = if self.include_usage {
                        Step::Usage
                    } else {
                        Step::Done
                    };
                    break g.finish_event();
                }
                Step::Usage => {
                    self.step = Step::Done;
                    break g.usage_event();
                }
                Step::Done => {
                    self.step = Step::End;
                    if let Some(visit) = self.visit.take() {
                        visit.answered();
                    }
                    break Bytes::from_static(b"data: [DONE]\n\n");
                }
                Step::End => return None,
            }
        };
        self.sent += 1;
        Some(Ok(event))
    }
}

/// The answer streamed as SSE; `visit` is answered when the engine ends the stream.
pub(crate) fn stream_response(
    generation: Generation,
    include_usage: bool,
    visit: Visit,
) -> Response {
    let state = StreamState {
        generation,
        step: Step::Role,
        include_usage,
        sent: 0,
        visit: Some(visit),
    };
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let event = state.next_event().await?;
        Some((event, state))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("a static response head is valid")
}
