//! Short questions about long documents.
//!
//! Each request is one of `documents` long documents (drawn with a [`Popularity`])
//! followed by a short question of its own, answered briefly: retrieval over a
//! corpus, or users asking about the same contracts, papers and manuals. Requests
//! arrive as a Poisson process and carry no session.

use serde::{Deserialize, Serialize};

use super::{Popular, Popularity, generators, log_uniform};
use crate::trace::{Segment, TraceRequest};

/// The shape of a long-document workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocumentWorkload {
    /// Seeds every draw.
    pub seed: u64,
    /// Requests to generate.
    pub requests: usize,
    /// Requests per second, on average.
    pub requests_per_sec: f64,
    /// Distinct documents.
    pub documents: u32,
    /// How often each document is asked about.
    pub popularity: Popularity,
    /// Document length range, tokens.
    pub document_tokens: (u32, u32),
    /// Question length range, tokens.
    pub question_tokens: (u32, u32),
    /// Answer length range, tokens.
    pub output_tokens: (u32, u32),
}

impl Default for DocumentWorkload {
    fn default() -> Self {
        Self {
            seed: 7,
            requests: 10_000,
            requests_per_sec: 100.0,
            documents: 100,
            popularity: Popularity::Zipf,
            document_tokens: (8_000, 32_000),
            question_tokens: (10, 100),
            output_tokens: (10, 200),
        }
    }
}

impl DocumentWorkload {
    /// The trace, in arrival order.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let (mut sizes, mut times) = generators(self.seed);
        let documents = Popular::new(self.documents, self.popularity);
        let lengths: Vec<u32> = (0..self.documents.max(1))
            .map(|_| log_uniform(&mut sizes, self.document_tokens))
            .collect();
        super::sessions(
            self.requests,
            self.requests_per_sec,
            &mut times,
            |n, start_s, _| {
                let document = documents.pick(&mut sizes);
                vec![TraceRequest {
                    at_us: super::micros(start_s),
                    model: None,
                    session: None,
                    prompt: vec![
                        Segment::Named {
                            id: format!("doc-{document}"),
                            tokens: lengths[document],
                        },
                        Segment::Named {
                            id: format!("question-{n}"),
                            tokens: log_uniform(&mut sizes, self.question_tokens),
                        },
                    ],
                    output_tokens: log_uniform(&mut sizes, self.output_tokens),
                }]
            },
        )
    }
}
