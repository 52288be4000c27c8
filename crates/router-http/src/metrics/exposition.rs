//! The two text formats `/metrics` answers in. Prometheus text 0.0.4 is the default:
//! plain scrapers, `curl` and most agents expect it unless they ask otherwise.
//! OpenMetrics 1.0.0 is what prometheus-client encodes, and what a scraper that lists
//! `application/openmetrics-text` in `Accept` (Prometheus itself) gets.

use std::fmt::Write as _;

use http::HeaderValue;

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics text format 1.0.0.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it accepts
    /// `application/openmetrics-text` at least as much as Prometheus text
    /// (`text/plain`, or `text/*` or `*/*` standing for it), else Prometheus text.
    pub(crate) fn negotiate(accept: Option<&HeaderValue>) -> Self {
        let Some(accept) = accept.and_then(|a| a.to_str().ok()) else {
            return Format::Prometheus;
        };
        let (mut openmetrics, mut text) = (0.0_f32, 0.0_f32);
        for range in accept.split(',') {
            let mut params = range.split(';');
            let media = params
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            let quality = params
                .filter_map(|p| p.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, q)| q.trim().parse::<f32>().ok())
                .filter(|q| (0.0..=1.0).contains(q))
                .unwrap_or(0.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `content-type` of an answer in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The Prometheus text form of prometheus-client's OpenMetrics output. The samples
/// are the same; the formats differ in what a family is called and in the framing:
/// a counter family is named with its `_total` suffix, an info family is a gauge
/// named with `_info`, `unknown` is `untyped`, and there are no `# UNIT` lines and no
/// `# EOF`. The samples between two descriptor lines are copied in one piece.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    // Room for the counter families' `_total` suffixes too, so the text is not
    // copied again as it grows.
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 8);
    let mut rest = openmetrics;
    while !rest.is_empty() {
        let samples = if rest.starts_with('#') {
            0
        } else {
            memchr::memmem::find(rest.as_bytes(), b"\n#").map_or(rest.len(), |at| at + 1)
        };
        out.push_str(&rest[..samples]);
        rest = &rest[samples..];
        let Some(comment) = line(rest) else {
            break;
        };
        rest = &rest[comment.len()..];
        let comment = comment.strip_suffix('\n').unwrap_or(comment);
        descriptor(&mut out, comment, line(rest));
    }
    out
}

/// The first line of `text` with its newline, if `text` is not empty.
fn line(text: &str) -> Option<&str> {
    let end = memchr::memchr(b'\n', text.as_bytes()).map_or(text.len(), |at| at + 1);
    (end > 0).then(|| &text[..end])
}

/// Writes the Prometheus text form of the comment line `line` (without its newline)
/// to `out`; `next` is the line after it, which names the type of a `# HELP` line's
/// family.
fn descriptor(out: &mut String, line: &str, next: Option<&str>) {
    if line == "# EOF" || line.starts_with("# UNIT ") {
        return;
    }
    let descriptor = line
        .strip_prefix("# HELP ")
        .map(|rest| ("HELP", rest))
        .or_else(|| line.strip_prefix("# TYPE ").map(|rest| ("TYPE", rest)));
    let Some((kind, rest)) = descriptor else {
        out.push_str(line);
        out.push('\n');
        return;
    };
    let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
    // A family's TYPE line follows its HELP line.
    let family_type = if kind == "TYPE" {
        tail
    } else {
        next.and_then(|next| next.strip_prefix("# TYPE "))
            .and_then(|next| next.strip_prefix(name))
            .map_or("", str::trim)
    };
    let (suffix, prometheus_type) = match family_type {
        "counter" => ("_total", "counter"),
        "info" => ("_info", "gauge"),
        "unknown" => ("", "untyped"),
        other => ("", other),
    };
    let tail = if kind == "TYPE" {
        prometheus_type
    } else {
        tail
    };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# {kind} {name}{suffix} {tail}");
}
