//! A PromQL reader just deep enough to list what an expression reads: the metric
//! names, the labels each selector's matchers name, and the label lists of `by`,
//! `without`, `on`, `ignoring`, `group_left` and `group_right`. It does not evaluate
//! or fully parse: functions and aggregations are known by name (an unknown one is an
//! error, so a misspelt function cannot pass as a metric), and strings and range
//! brackets (`[5m]`, `[$__rate_interval]`, a subquery's `[1h:1m]`) are skipped whole.

/// One selector: a metric and the labels its matchers name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selector {
    pub(crate) metric: String,
    pub(crate) labels: Vec<String>,
}

/// What an expression reads.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Reads {
    pub(crate) selectors: Vec<Selector>,
    /// The labels of `by (...)` lists: what the aggregations keep.
    pub(crate) by: Vec<String>,
    /// The labels of `without`, `on`, `ignoring`, `group_left` and `group_right` lists.
    pub(crate) matching: Vec<String>,
    /// Whether an aggregation drops every label but its `by` list (it aggregates, and
    /// no `without` keeps the others).
    pub(crate) keeps_only_by: bool,
}

/// Aggregation operators.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// Functions. `label_replace` and `label_join` are left out on purpose: they make
/// labels out of strings, which this reader does not follow.
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "idelta",
    "increase",
    "irate",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "max_over_time",
    "min_over_time",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "time",
    "timestamp",
    "vector",
];

/// Words that take a label list.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Words that are neither metrics nor calls.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "group_left",
    "group_right",
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// A string literal.
    Str,
    /// A number, a duration, or a Grafana variable outside a string (`$__range`).
    Value,
    /// A range or subquery bracket, skipped whole.
    Range,
    /// `(`, `)`, `{`, `}` or `,`.
    Punct(char),
    Op(String),
}

/// What `expr` reads.
pub(crate) fn read(expr: &str) -> Result<Reads, String> {
    let tokens = lex(expr)?;
    balanced(&tokens)?;
    let mut reads = Reads::default();
    let mut aggregates = false;
    let mut without = false;
    let mut i = 0;
    while i < tokens.len() {
        let name = match &tokens[i] {
            Token::Ident(name) => name,
            Token::Punct('{') => return Err("a selector without a metric name".into()),
            _ => {
                i += 1;
                continue;
            }
        };
        let word = name.to_ascii_lowercase();
        let next = tokens.get(i + 1);
        let opens = next == Some(&Token::Punct('('));
        if GROUPING.contains(&word.as_str()) && opens {
            let (labels, end) = label_list(&tokens, i + 2)?;
            if word == "by" {
                reads.by.extend(labels);
            } else {
                without |= word == "without";
                reads.matching.extend(labels);
            }
            i = end;
        } else if AGGREGATIONS.contains(&word.as_str())
            && (opens || matches!(next, Some(Token::Ident(n)) if n == "by" || n == "without"))
        {
            aggregates = true;
            i += 1;
        } else if opens {
            if !FUNCTIONS.contains(&name.as_str()) {
                return Err(format!("unknown function `{name}`"));
            }
            i += 1;
        } else if KEYWORDS.contains(&word.as_str()) {
            i += 1;
        } else {
            let mut selector = Selector {
                metric: name.clone(),
                labels: Vec::new(),
            };
            i += 1;
            if tokens.get(i) == Some(&Token::Punct('{')) {
                let (labels, end) = matchers(&tokens, i + 1)?;
                selector.labels = labels;
                i = end;
            }
            reads.selectors.push(selector);
        }
    }
    reads.keeps_only_by = aggregates && !without;
    Ok(reads)
}

/// The labels of a list whose `(` is before `start`, and the index after its `)`.
fn label_list(tokens: &[Token], mut i: usize) -> Result<(Vec<String>, usize), String> {
    let mut labels = Vec::new();
    loop {
        match tokens.get(i) {
            Some(Token::Punct(')')) => return Ok((labels, i + 1)),
            Some(Token::Ident(label)) => labels.push(label.clone()),
            other => return Err(format!("a label list holds {other:?}")),
        }
        match tokens.get(i + 1) {
            Some(Token::Punct(',')) => i += 2,
            Some(Token::Punct(')')) => return Ok((labels, i + 2)),
            other => return Err(format!("a label list goes on with {other:?}")),
        }
    }
}

/// The labels of the matchers after a selector's `{` (before `start`), and the index
/// after its `}`.
fn matchers(tokens: &[Token], mut i: usize) -> Result<(Vec<String>, usize), String> {
    let mut labels = Vec::new();
    loop {
        let label = match tokens.get(i) {
            Some(Token::Punct('}')) => return Ok((labels, i + 1)),
            Some(Token::Ident(label)) => label.clone(),
            other => return Err(format!("a matcher starts with {other:?}")),
        };
        match tokens.get(i + 1) {
            Some(Token::Op(op)) if ["=", "!=", "=~", "!~"].contains(&op.as_str()) => {}
            other => return Err(format!("the matcher of `{label}` has {other:?}")),
        }
        if tokens.get(i + 2) != Some(&Token::Str) {
            return Err(format!("the matcher of `{label}` has no string"));
        }
        labels.push(label);
        match tokens.get(i + 3) {
            Some(Token::Punct(',')) => i += 4,
            Some(Token::Punct('}')) => return Ok((labels, i + 4)),
            other => return Err(format!("matchers go on with {other:?}")),
        }
    }
}

/// Checks that parentheses pair up.
fn balanced(tokens: &[Token]) -> Result<(), String> {
    let mut depth = 0_i32;
    for token in tokens {
        match token {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err("a `)` closes nothing".into());
        }
    }
    if depth == 0 {
        Ok(())
    } else {
        Err("a `(` is never closed".into())
    }
}

fn lex(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let at = |j: usize| chars.get(j).copied();
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => i = skip_while(&chars, i, |c| c != '\n'),
            '"' | '\'' | '`' => {
                i = skip_string(&chars, i)?;
                tokens.push(Token::Str);
            }
            '[' => {
                i = i + 1 + find(&chars[i + 1..], ']').ok_or("a `[` is never closed")? + 1;
                tokens.push(Token::Range);
            }
            '(' | ')' | '{' | '}' | ',' => {
                tokens.push(Token::Punct(c));
                i += 1;
            }
            '$' => {
                i = if at(i + 1) == Some('{') {
                    i + 2 + find(&chars[i + 2..], '}').ok_or("a `${` is never closed")? + 1
                } else {
                    skip_while(&chars, i + 1, |c| c.is_ascii_alphanumeric() || c == '_')
                };
                tokens.push(Token::Value);
            }
            c if c.is_ascii_digit()
                || (c == '.' && at(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                i = skip_number(&chars, i);
                tokens.push(Token::Value);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let end = skip_while(&chars, i, |c| {
                    c.is_ascii_alphanumeric() || c == '_' || c == ':'
                });
                tokens.push(Token::Ident(chars[i..end].iter().collect()));
                i = end;
            }
            '=' | '!' | '<' | '>' => {
                let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
                let op = if ["==", "!=", "=~", "!~", "<=", ">="].contains(&two.as_str()) {
                    two
                } else if c == '!' {
                    return Err("a `!` without `=` or `~`".into());
                } else {
                    c.to_string()
                };
                i += op.len();
                tokens.push(Token::Op(op));
            }
            '+' | '-' | '*' | '/' | '%' | '^' | '@' => {
                tokens.push(Token::Op(c.to_string()));
                i += 1;
            }
            _ => return Err(format!("an unexpected `{c}`")),
        }
    }
    Ok(tokens)
}

fn find(chars: &[char], wanted: char) -> Option<usize> {
    chars.iter().position(|&c| c == wanted)
}

fn skip_while(chars: &[char], mut i: usize, keep: impl Fn(char) -> bool) -> usize {
    while chars.get(i).is_some_and(|&c| keep(c)) {
        i += 1;
    }
    i
}

/// The index after the string that opens at `start` (a backslash escapes in `"` and
/// `'` strings; a backtick string is raw).
fn skip_string(chars: &[char], start: usize) -> Result<usize, String> {
    let quote = chars[start];
    let mut i = start + 1;
    while let Some(&c) = chars.get(i) {
        if c == quote {
            return Ok(i + 1);
        }
        i += if c == '\\' && quote != '`' { 2 } else { 1 };
    }
    Err(format!("a {quote} string is never closed"))
}

/// The index after the number or duration at `start`: digits, letters (`5m`, `0x1f`,
/// `1e3`), dots and underscores, and an exponent's sign (`1e-9`).
fn skip_number(chars: &[char], start: usize) -> usize {
    let mut i = start;
    while let Some(&c) = chars.get(i) {
        let exponent_sign = (c == '+' || c == '-')
            && matches!(chars.get(i - 1), Some('e' | 'E'))
            && chars[start..i - 1]
                .iter()
                .all(|c| c.is_ascii_digit() || *c == '.');
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exponent_sign {
            i += 1;
        } else {
            break;
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(metric: &str, labels: &[&str]) -> Selector {
        Selector {
            metric: metric.into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        }
    }

    fn strings(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn a_quantile_of_a_histogram_reads_the_bucket_series_and_its_grouping() {
        let reads = read(
            r#"histogram_quantile(0.99, sum by (le, stage) (rate(x_seconds_bucket{job=~"$job", a!="}"}[$__rate_interval])))"#,
        )
        .unwrap();
        assert_eq!(
            reads.selectors,
            [selector("x_seconds_bucket", &["job", "a"])]
        );
        assert_eq!(reads.by, strings(&["le", "stage"]));
        assert!(reads.keeps_only_by);
    }

    #[test]
    fn bare_metrics_binary_operators_and_vector_matching_are_read() {
        let reads = read(
            "(max by (e) (max_over_time(a[6h])) unless on (e) b offset 5m)\n\
             and on (e) group_left (m) (c == bool 1) > 1e-9 # a comment names d\n",
        )
        .unwrap();
        assert_eq!(
            reads.selectors,
            [selector("a", &[]), selector("b", &[]), selector("c", &[])]
        );
        assert_eq!(reads.by, strings(&["e"]));
        assert_eq!(reads.matching, strings(&["e", "e", "m"]));
    }

    #[test]
    fn a_grouping_after_the_aggregated_expression_and_without_are_read() {
        let reads = read("sum(rate(a{x='1',}[5m])) by (x,)").unwrap();
        assert_eq!(reads.selectors, [selector("a", &["x"])]);
        assert_eq!(reads.by, strings(&["x"]));
        let reads = read("sum without (y) (a)").unwrap();
        assert_eq!(reads.matching, strings(&["y"]));
        assert!(!reads.keeps_only_by, "without keeps the other labels");
        assert!(!read("a / b").unwrap().keeps_only_by);
    }

    #[test]
    fn what_cannot_be_checked_is_an_error() {
        for (expr, error) in [
            ("rat(a[5m])", "unknown function `rat`"),
            (
                "label_replace(a, \"d\", \"$1\", \"s\", \"(.*)\")",
                "unknown function",
            ),
            ("{__name__=\"a\"}", "without a metric name"),
            ("sum(a", "never closed"),
            ("a)", "closes nothing"),
            ("a{x=\"1}", "never closed"),
            ("a{x}", "the matcher of `x`"),
            ("a[5m", "never closed"),
            ("a ! b", "a `!`"),
        ] {
            let got = read(expr).expect_err(expr);
            assert!(got.contains(error), "{expr}: {got}");
        }
    }
}
