//! The workload shapes: bursts, agent sessions, long documents, and popularity.

use std::collections::{BTreeMap, HashMap, HashSet};

use router_replay::{
    AgentWorkload, BurstWorkload, DocumentWorkload, Popularity, Segment, SharedPrefixWorkload,
    TraceRequest, Workload,
};

/// A named segment's id.
fn id(segment: &Segment) -> &str {
    match segment {
        Segment::Named { id, .. } => id,
        Segment::Recorded { .. } | Segment::Pages { .. } => panic!("generated prompts are named"),
    }
}

fn in_arrival_order(trace: &[TraceRequest]) -> bool {
    trace.windows(2).all(|w| w[0].at_us <= w[1].at_us)
}

#[test]
fn a_burst_shares_one_new_prefix_within_its_window_over_background_conversations() {
    let workload = BurstWorkload {
        requests: 4000,
        ..BurstWorkload::default()
    };
    let trace = workload.generate();
    assert_eq!(trace.len(), 4000);
    assert!(in_arrival_order(&trace));
    assert_eq!(trace, workload.generate(), "a seed gives one trace");
    let mut bursts: BTreeMap<&str, Vec<&TraceRequest>> = BTreeMap::new();
    let mut background = 0;
    let mut suffixes = HashSet::new();
    for request in &trace {
        let prefix = id(&request.prompt[0]);
        if prefix.starts_with("burst-") {
            assert_eq!(request.prompt.len(), 2, "the prefix, then a suffix");
            assert!(
                suffixes.insert(id(&request.prompt[1])),
                "a suffix of its own"
            );
            assert_eq!(request.session, None);
            bursts.entry(prefix).or_default().push(request);
        } else {
            assert!(prefix.starts_with("system-"), "{prefix}");
            assert!(
                request
                    .session
                    .as_deref()
                    .is_some_and(|s| s.starts_with('c'))
            );
            background += 1;
        }
    }
    let last = trace.last().unwrap().at_us;
    let mut whole = 0;
    for (prefix, requests) in &bursts {
        let first = requests[0].at_us;
        // Every request naming the prefix comes within the window of the first: no
        // request before the burst named it, none after.
        assert!(
            requests
                .iter()
                .all(|r| r.at_us - first < workload.window_us),
            "{prefix}: {:?}",
            requests.iter().map(|r| r.at_us).collect::<Vec<_>>()
        );
        assert_eq!(
            requests
                .iter()
                .map(|r| r.prompt[0].len())
                .collect::<HashSet<_>>()
                .len(),
            1,
            "one length per prefix"
        );
        let len = requests[0].prompt[0].len();
        assert!((2000..=8000).contains(&len), "{prefix}: {len} tokens");
        if first + workload.window_us < last {
            whole += 1;
            assert!(
                (16..=64).contains(&requests.len()),
                "{prefix}: {} requests",
                requests.len()
            );
        }
    }
    assert!(whole > 10, "{whole} whole bursts");
    let share = 1.0 - f64::from(background) / trace.len() as f64;
    assert!((0.2..0.4).contains(&share), "bursts' share {share}");
}

#[test]
fn agent_sessions_append_tool_results_and_sub_agents_share_the_parents_prefix() {
    let workload = AgentWorkload {
        requests: 4000,
        ..AgentWorkload::default()
    };
    let trace = workload.generate();
    assert_eq!(trace.len(), 4000);
    assert!(in_arrival_order(&trace));
    assert_eq!(trace, workload.generate(), "a seed gives one trace");
    let mut sessions: HashMap<&str, Vec<&TraceRequest>> = HashMap::new();
    for request in &trace {
        let tools = id(&request.prompt[0]);
        let k: u32 = tools.strip_prefix("tools-").unwrap().parse().unwrap();
        assert!(k < workload.tool_prompts, "{tools}");
        sessions
            .entry(request.session.as_deref().unwrap())
            .or_default()
            .push(request);
    }
    let mut parents_with_results = 0;
    let mut subagents = 0;
    for (session, requests) in &sessions {
        // Each turn extends the one before by its call (the answer) and the result.
        for pair in requests.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let n = earlier.prompt.len();
            assert_eq!(later.prompt[..n], earlier.prompt[..], "{session}");
            assert_eq!(later.prompt.len(), n + 2, "{session}");
            assert_eq!(later.prompt[n].len(), u64::from(earlier.output_tokens));
            assert!(id(&later.prompt[n + 1]).contains("-result-"));
            assert!(later.at_us > earlier.at_us);
            parents_with_results += 1;
        }
        let Some((parent, turn)) = session
            .split_once("-sub")
            .map(|(parent, rest)| (parent, rest.split('-').next().unwrap()))
        else {
            continue;
        };
        subagents += 1;
        let turn: usize = turn.parse().unwrap();
        let first = requests[0];
        let Some(parents) = sessions.get(parent) else {
            continue;
        };
        // The parent's turn that started it, and the turn after, which takes the
        // sub-agents' answers as its result.
        let (Some(started), Some(next)) = (parents.get(turn), parents.get(turn + 1)) else {
            continue;
        };
        let shared = started.prompt.len() + 1;
        assert_eq!(
            first.prompt[..shared],
            next.prompt[..shared],
            "{session}: the parent's prompt so far and the call that started it"
        );
        assert_eq!(first.prompt.len(), shared + 1, "then a task of its own");
        assert!(id(&first.prompt[shared]).ends_with("-task"));
        assert!(first.at_us > started.at_us);
        assert!(
            requests.iter().all(|r| r.at_us < next.at_us),
            "{session}: the parent goes on once its sub-agents answered"
        );
        // Its siblings arrive before the parent's next turn, so the trace holds them.
        let answers: u64 = (0..)
            .map_while(|j| sessions.get(format!("{parent}-sub{turn}-{j}").as_str()))
            .map(|requests| u64::from(requests.last().unwrap().output_tokens))
            .sum();
        assert_eq!(
            next.prompt[shared].len(),
            answers,
            "{session}: the result is the sub-agents' answers"
        );
    }
    assert!(parents_with_results > 1000, "{parents_with_results}");
    assert!(subagents > 50, "{subagents} sub-agents");
}

#[test]
fn documents_repeat_by_popularity_with_short_questions() {
    let count = |popularity| {
        let trace = DocumentWorkload {
            requests: 5000,
            popularity,
            ..DocumentWorkload::default()
        }
        .generate();
        assert!(in_arrival_order(&trace));
        let mut asked: HashMap<&str, u32> = HashMap::new();
        let mut lengths: HashMap<&str, u64> = HashMap::new();
        let mut questions = HashSet::new();
        for request in &trace {
            let [document, question] = &request.prompt[..] else {
                panic!("a document, then a question")
            };
            assert!((8000..=32000).contains(&document.len()));
            assert!((10..=100).contains(&question.len()));
            assert!((10..=200).contains(&request.output_tokens));
            assert!(questions.insert(id(question)), "a question of its own");
            let length = lengths.entry(id(document)).or_insert(document.len());
            assert_eq!(*length, document.len(), "one length per document");
            *asked.entry(id(document)).or_default() += 1;
        }
        (
            asked["doc-0"],
            asked.values().copied().max().unwrap(),
            asked.len(),
        )
    };
    let (first, most, documents) = count(Popularity::Zipf);
    assert_eq!(first, most, "the first document is the most asked about");
    // Zipf(1) over 100 documents: the first takes 1/H(100), about 19%.
    assert!((800..1150).contains(&first), "{first} of 5000");
    assert!(documents > 90, "{documents}");
    let (_, most, documents) = count(Popularity::Uniform);
    assert_eq!(documents, 100);
    assert!(most < 90, "uniform: about 50 each, not {most}");
}

#[test]
fn uniform_popularity_spreads_system_prompts_that_zipf_concentrates() {
    let top_share = |popularity| {
        let trace = SharedPrefixWorkload {
            requests: 4000,
            popularity,
            ..SharedPrefixWorkload::default()
        }
        .generate();
        let mut opened: HashMap<&str, u32> = HashMap::new();
        let first_turns = trace.iter().filter(|r| r.prompt.len() == 2);
        let mut n = 0;
        for request in first_turns {
            *opened.entry(id(&request.prompt[0])).or_default() += 1;
            n += 1;
        }
        f64::from(opened.values().copied().max().unwrap()) / f64::from(n)
    };
    // 64 system prompts: Zipf(1) opens 1/H(64), about 21%, with the first; uniform
    // about 1.6% with each.
    let zipf = top_share(Popularity::Zipf);
    let uniform = top_share(Popularity::Uniform);
    assert!((0.17..0.26).contains(&zipf), "{zipf}");
    assert!(uniform < 0.04, "{uniform}");
}

/// Each shape's workload, `requests` requests at `rate` a second.
fn shapes(requests: usize, rate: f64) -> Vec<Workload> {
    let mut shapes = vec![
        Workload::Conversations(SharedPrefixWorkload {
            requests,
            ..SharedPrefixWorkload::default()
        }),
        Workload::Bursts(BurstWorkload {
            requests,
            ..BurstWorkload::default()
        }),
        Workload::Agents(AgentWorkload {
            requests,
            ..AgentWorkload::default()
        }),
        Workload::Documents(DocumentWorkload {
            requests,
            ..DocumentWorkload::default()
        }),
    ];
    for shape in &mut shapes {
        shape.set_requests_per_sec(rate);
        assert_eq!(shape.requests_per_sec(), rate);
    }
    shapes
}

#[test]
fn every_shape_arrives_at_its_rate() {
    for workload in shapes(20_000, 50.0) {
        let trace = workload.generate();
        assert_eq!(trace.len(), 20_000);
        let rate = trace.len() as f64 / (trace.last().unwrap().at_us as f64 / 1e6);
        assert!((42.0..58.0).contains(&rate), "{rate}/s: {workload:?}");
    }
}

#[test]
fn the_rate_moves_every_shapes_requests_in_time_without_changing_a_token() {
    /// Each prefix's or session's prompts, of the first few.
    fn early(trace: &[TraceRequest]) -> BTreeMap<String, Vec<Vec<Segment>>> {
        let mut groups: BTreeMap<String, Vec<Vec<Segment>>> = BTreeMap::new();
        for request in trace {
            let key = request
                .session
                .clone()
                .unwrap_or_else(|| id(&request.prompt[1]).to_owned());
            let n: Option<u32> = key
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok());
            if n.is_some_and(|n| n < 5) {
                groups.entry(key).or_default().push(request.prompt.clone());
            }
        }
        groups
    }
    for (slow, fast) in shapes(3000, 10.0).into_iter().zip(shapes(3000, 1000.0)) {
        let (slow_trace, fast_trace) = (slow.generate(), fast.generate());
        assert!(
            slow_trace.last().unwrap().at_us > 10 * fast_trace.last().unwrap().at_us,
            "{slow:?}"
        );
        let (slow_groups, fast_groups) = (early(&slow_trace), early(&fast_trace));
        // The fast trace ends sooner, maybe within a session: its turns so far.
        let mut common = 0;
        for (key, fast_prompts) in &fast_groups {
            let Some(slow_prompts) = slow_groups.get(key) else {
                continue;
            };
            common += 1;
            let n = fast_prompts.len().min(slow_prompts.len());
            assert!(n > 0);
            assert_eq!(slow_prompts[..n], fast_prompts[..n], "{key}: {slow:?}");
        }
        assert!(common >= 5, "{common}: {slow:?}");
    }
}
