//! An engine's load read from its Prometheus `/metrics` text, for engines without a
//! `LoadStat` feed (vLLM): running and waiting requests and KV-cache usage per
//! data-parallel rank (vLLM's `engine` label), and the KV capacity its
//! `vllm:cache_config_info` states.

/// One rank's load as the engine's metrics state it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScrapedRank {
    /// `vllm:num_requests_running`.
    pub running_requests: u64,
    /// `vllm:num_requests_waiting`.
    pub waiting_requests: u64,
    /// `vllm:kv_cache_usage_perc` (older releases: `vllm:gpu_cache_usage_perc`), a
    /// fraction from 0 to 1.
    pub kv_usage: Option<f64>,
    /// `num_gpu_blocks` x `block_size` of `vllm:cache_config_info`.
    pub kv_capacity_tokens: Option<u64>,
    /// Whether any load metric named this rank.
    pub seen: bool,
}

/// The series a scrape reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Series {
    Running,
    Waiting,
    KvUsage,
    CacheConfig,
}

fn series(name: &str) -> Option<Series> {
    match name {
        "vllm:num_requests_running" => Some(Series::Running),
        "vllm:num_requests_waiting" => Some(Series::Waiting),
        "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => Some(Series::KvUsage),
        "vllm:cache_config_info" => Some(Series::CacheConfig),
        _ => None,
    }
}

/// Reads the load of ranks `0..dp_size` from a `/metrics` text. A series without an
/// `engine` label is rank 0; series of a rank are summed (requests) or the largest
/// taken (usage); anything unreadable is skipped, never an error.
pub fn parse_load_metrics(text: &str, dp_size: u32) -> Vec<ScrapedRank> {
    let mut ranks = vec![ScrapedRank::default(); dp_size as usize];
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        let Some(series) = series(sample.name) else {
            continue;
        };
        let rank = match sample.label("engine") {
            None => 0,
            Some(rank) => match rank.parse::<u32>() {
                Ok(rank) if rank < dp_size => rank,
                _ => continue,
            },
        };
        let Some(slot) = ranks.get_mut(rank as usize) else {
            continue;
        };
        match series {
            Series::Running => {
                slot.running_requests = slot.running_requests.saturating_add(count(sample.value));
                slot.seen = true;
            }
            Series::Waiting => {
                slot.waiting_requests = slot.waiting_requests.saturating_add(count(sample.value));
                slot.seen = true;
            }
            Series::KvUsage => {
                if let Ok(usage) = sample.value.parse::<f64>()
                    && (0.0..=1.0).contains(&usage)
                {
                    slot.kv_usage = Some(slot.kv_usage.map_or(usage, |u| u.max(usage)));
                    slot.seen = true;
                }
            }
            Series::CacheConfig => {
                let number = |name| sample.label(name)?.parse::<u64>().ok();
                if let (Some(blocks), Some(size)) = (number("num_gpu_blocks"), number("block_size"))
                {
                    slot.kv_capacity_tokens = blocks.checked_mul(size);
                }
            }
        }
    }
    ranks
}

/// A gauge's value as a request count: a finite, non-negative number, rounded.
fn count(value: &str) -> u64 {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => v.round().min(u64::MAX as f64) as u64,
        _ => 0,
    }
}

/// One sample line: `name{labels} value [timestamp]`, the labels kept as written.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: &'a str,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
        let name = &line[..name_end];
        let rest = &line[name_end..];
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(inside) => {
                let end = closing_brace(inside)?;
                (&inside[..end], &inside[end + 1..])
            }
            None => ("", rest),
        };
        let value = rest.split_whitespace().next()?;
        Some(Self {
            name,
            labels,
            value,
        })
    }

    /// The value of label `name`, when it holds no escapes.
    fn label(&self, name: &str) -> Option<&'a str> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            let (key, after) = rest.split_once('=')?;
            let after = after.strip_prefix('"')?;
            let end = closing_quote(after)?;
            let value = &after[..end];
            if key.trim() == name {
                return (!value.contains('\\')).then_some(value);
            }
            rest = &after[end + 1..];
        }
    }
}

/// Where the label set opened before `text` closes: the first `}` outside quotes.
fn closing_brace(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The end of a quoted label value that began before `text`.
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What vLLM 0.11 (V1 engine, two data-parallel ranks) exposes, abridged to the
    /// series read here and a few neighbours.
    const TWO_RANKS: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 1234.0
"#;

    #[test]
    fn each_rank_gets_its_requests_usage_and_capacity() {
        let ranks = parse_load_metrics(TWO_RANKS, 2);
        assert_eq!(
            ranks,
            vec![
                ScrapedRank {
                    running_requests: 3,
                    waiting_requests: 2,
                    kv_usage: Some(0.25),
                    kv_capacity_tokens: Some(432_000),
                    seen: true,
                },
                ScrapedRank {
                    running_requests: 1,
                    waiting_requests: 0,
                    kv_usage: Some(0.5),
                    kv_capacity_tokens: Some(432_000),
                    seen: true,
                },
            ]
        );
        assert_eq!(
            parse_load_metrics(TWO_RANKS, 1).len(),
            1,
            "ranks past the engine's size are skipped"
        );
    }

    #[test]
    fn an_unlabelled_engine_is_rank_0_and_old_names_are_read() {
        let text = "vllm:num_requests_running{model_name=\"m\"} 4\nvllm:gpu_cache_usage_perc 0.75\nvllm:num_requests_waiting{model_name=\"a \\\"quoted} name\"} 1e0 1700000000\n";
        let ranks = parse_load_metrics(text, 1);
        assert_eq!(
            ranks[0],
            ScrapedRank {
                running_requests: 4,
                waiting_requests: 1,
                kv_usage: Some(0.75),
                kv_capacity_tokens: None,
                seen: true,
            }
        );
    }

    #[test]
    fn huge_values_saturate() {
        let text = "vllm:num_requests_running{model_name=\"a\"} 1e300\nvllm:num_requests_running{model_name=\"b\"} 1e300\n";
        assert_eq!(parse_load_metrics(text, 1)[0].running_requests, u64::MAX);
    }

    #[test]
    fn unreadable_samples_are_skipped() {
        let text = "vllm:num_requests_running{engine=\"x\"} 4\nvllm:num_requests_running{engine=\"0\"} NaN\nvllm:kv_cache_usage_perc 7\nvllm:num_requests_waiting{engine=\"0\" 3\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n";
        assert_eq!(
            parse_load_metrics(text, 1)[0],
            ScrapedRank {
                seen: true,
                ..ScrapedRank::default()
            }
        );
    }

    proptest! {
        #[test]
        fn any_text_parses_without_panicking(text in "\\PC*", dp in 1_u32..4) {
            let ranks = parse_load_metrics(&text, dp);
            prop_assert_eq!(ranks.len(), dp as usize);
        }

        #[test]
        fn any_mutation_of_a_real_exposition_parses_without_panicking(
            cut in 0_usize..2000,
            insert in "[{}\"\\\\=, a-z0-9.\n]{0,8}",
        ) {
            let mut text = TWO_RANKS.to_owned();
            let at = (0..=cut.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            text.insert_str(at, &insert);
            let _ = parse_load_metrics(&text, 2);
        }
    }
}
