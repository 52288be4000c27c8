use super::*;

fn hits() -> PrefixHits {
    PrefixHits::new(8, 16, vec![("a".into(), 8), ("b".into(), 4)])
        .with_ranks(vec![("a".into(), 1), ("b".into(), 0)])
        .with_slower_blocks(vec![("b".into(), 3)])
        .with_feed_age_ms(vec![("a".into(), 2500)])
}

fn read(json: &[u8]) -> PrefixHits {
    serde_json::from_slice::<Answer>(json)
        .unwrap()
        .into_hits()
        .unwrap()
}

#[test]
fn tiers_and_feed_ages_cross_the_wire() {
    assert_eq!(read(&answer_json(&hits()).unwrap()), hits());
}

#[test]
fn an_answer_leaves_out_empty_tiers_and_ages() {
    let hits = hits()
        .with_slower_blocks(Vec::new())
        .with_feed_age_ms(Vec::new());
    let json = answer_json(&hits).unwrap();
    assert_eq!(
        String::from_utf8(json.clone()).unwrap(),
        r#"{"query_blocks":8,"block_size":16,"engines":[["a",8],["b",4]],"ranks":[["a",1],["b",0]]}"#
    );
    assert_eq!(read(&json), hits);
}

#[test]
fn an_answer_without_tiers_or_ages_means_device_copies_from_fresh_feeds() {
    let hits =
        read(br#"{"query_blocks": 8, "block_size": 16, "engines": [["a", 8]], "ranks": []}"#);
    assert_eq!(hits.slower_tokens(&"a".into(), 128), 0);
    assert_eq!(hits.feed_age_ms_of(&"a".into()), 0);
}

/// An answer as a router reads it, `change`d.
fn changed(change: impl FnOnce(&mut Answer)) -> Result<PrefixHits, &'static str> {
    let mut answer: Answer = serde_json::from_slice(&answer_json(&hits()).unwrap()).unwrap();
    change(&mut answer);
    answer.into_hits()
}

#[test]
fn slower_blocks_beyond_an_engines_match_are_refused() {
    assert_eq!(
        changed(|a| a.slower_blocks = vec![("b".into(), 5)]).unwrap_err(),
        "an engine holding more blocks on slower tiers than in all"
    );
    assert_eq!(
        changed(|a| a.feed_age_ms = vec![("b".into(), 1), ("a".into(), 1)]).unwrap_err(),
        "engine ids that are not sorted, unique names"
    );
}

#[test]
fn fields_a_router_does_not_know_are_ignored() {
    let hits = read(
        br#"{"query_blocks": 8, "block_size": 16, "engines": [["a", 8]], "ranks": [],
             "a_later_field": [1, 2]}"#,
    );
    assert_eq!(hits.blocks_of(&"a".into()), 8);
}

fn lookup(model: &str, hashes: Vec<u64>, dry_run: bool) -> Lookup<'_> {
    Lookup {
        model: model.into(),
        hashes,
        dry_run,
    }
}

#[test]
fn a_binary_lookup_is_its_flags_the_model_and_the_hashes_little_endian() {
    let sent = lookup("m1", vec![1, u64::MAX, 0x0102_0304_0506_0708], true);
    let body = sent.to_binary().unwrap();
    let mut expected = vec![1, 2, b'm', b'1'];
    expected.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    expected.extend_from_slice(&[0xff; 8]);
    expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(body, expected);
    assert_eq!(Lookup::from_binary(&body).unwrap(), sent);
    let plain = lookup("m", Vec::new(), false);
    assert_eq!(plain.to_binary().unwrap(), [0, 1, b'm']);
    assert_eq!(Lookup::from_binary(&[0, 1, b'm']).unwrap(), plain);
}

#[test]
fn a_binary_lookup_that_does_not_fit_is_refused_with_why() {
    let refused = |body: &[u8]| Lookup::from_binary(body).unwrap_err();
    assert_eq!(refused(&[]), "shorter than its 2-byte header");
    assert_eq!(refused(&[0]), "shorter than its 2-byte header");
    assert_eq!(
        refused(&[2, 1, b'm']),
        "flags other than bit 0 (a dry run) are set"
    );
    assert_eq!(
        refused(&[0, 0]),
        "a model name of 1 to 128 bytes is required"
    );
    assert_eq!(
        refused(&[0, 129]),
        "a model name of 1 to 128 bytes is required"
    );
    assert_eq!(refused(&[0, 3, b'm']), "the model name runs past the body");
    assert_eq!(refused(&[0, 1, 0xff]), "a model name that is not UTF-8");
    assert_eq!(
        refused(&[0, 1, b'm', 1, 2, 3]),
        "the hashes are not whole 8-byte words"
    );
    let most = lookup("m", vec![7; MAX_HASHES], false).to_binary().unwrap();
    assert_eq!(Lookup::from_binary(&most).unwrap().hashes.len(), MAX_HASHES);
    let one_more = lookup("m", vec![7; MAX_HASHES + 1], false)
        .to_binary()
        .unwrap();
    assert_eq!(
        refused(&one_more),
        "more block hashes than a lookup may carry (65,536)"
    );
}

#[test]
fn a_model_name_that_does_not_fit_one_byte_is_not_sent() {
    assert_eq!(
        lookup("", vec![1], false).to_binary().unwrap_err(),
        "a model name of 1 to 128 bytes is required"
    );
    let long = "m".repeat(MAX_NAME_BYTES + 1);
    assert_eq!(
        lookup(&long, vec![1], false).to_binary().unwrap_err(),
        "a model name of 1 to 128 bytes is required"
    );
    let longest = "m".repeat(MAX_NAME_BYTES);
    let body = lookup(&longest, vec![1], false).to_binary().unwrap();
    assert_eq!(body.len(), MAX_BINARY_LOOKUP_BYTES - 8 * (MAX_HASHES - 1));
}

proptest::proptest! {
    // Whatever bytes a router (or anything reaching the indexer's port) sends, the
    // binary reader answers with a lookup within its bounds or a reason, never a
    // panic; and what a router writes reads back as it was.
    #[test]
    fn any_bytes_read_as_a_bounded_lookup_or_a_reason(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
    ) {
        if let Ok(read) = Lookup::from_binary(&body) {
            proptest::prop_assert!((1..=MAX_NAME_BYTES).contains(&read.model.len()));
            proptest::prop_assert!(read.hashes.len() <= MAX_HASHES);
            proptest::prop_assert_eq!(read.to_binary().unwrap(), body);
        }
    }

    #[test]
    fn a_lookup_written_in_binary_reads_back_as_it_was(
        model in "[a-zA-Z0-9/._-]{1,128}",
        hashes in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..64),
        dry_run in proptest::prelude::any::<bool>(),
    ) {
        let sent = lookup(&model, hashes, dry_run);
        let body = sent.to_binary().unwrap();
        proptest::prop_assert_eq!(Lookup::from_binary(&body).unwrap(), sent);
    }
}

#[test]
fn an_answer_claiming_a_longer_prompt_than_a_lookup_sends_is_refused() {
    for blocks in [MAX_HASHES + 1, 1 << 40, usize::MAX] {
        let json = format!(
            r#"{{"query_blocks":{blocks},"block_size":16,"engines":[["a",{blocks}]],"ranks":[]}}"#
        );
        let answer = serde_json::from_slice::<Answer>(json.as_bytes()).unwrap();
        assert_eq!(
            answer.into_hits(),
            Err("a prompt of more blocks than a lookup sends")
        );
    }
}
