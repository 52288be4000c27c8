//! The chat template's `tojson` filter as transformers defines it: Python's
//! `json.dumps(value, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, with those keyword arguments. Its output is what the engine's
//! prompt holds, so it is Python's to the byte: `", "` and `": "` between items,
//! floats written as Python's `repr` writes them, no HTML escaping.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use super::KnownTool;

/// How deep a value may nest: Python's own recursion limit refuses deeper ones.
const MAX_DEPTH: usize = 512;

/// The filter: `value | tojson(indent=None, ensure_ascii=False, separators=None,
/// sort_keys=False)`, `indent` also given first without its name.
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(text) => Some(text.to_owned()),
            None => {
                let n =
                    i64::try_from(v).map_err(|_| invalid("indent must be a number or a string"))?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(pair) if !pair.is_none() => {
            let items: Vec<Value> = pair.try_iter()?.collect();
            match items.as_slice() {
                [item, key] => (
                    item.as_str()
                        .ok_or_else(|| invalid("separators must be strings"))?
                        .to_owned(),
                    key.as_str()
                        .ok_or_else(|| invalid("separators must be strings"))?
                        .to_owned(),
                ),
                _ => return Err(invalid("separators must be a pair of strings")),
            }
        }
        // Python's default: no space before a newline when indenting.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let settings = Settings {
        indent,
        item: separators.0,
        key: separators.1,
        ensure_ascii,
        sort_keys,
    };
    // A tool seen before has its text written once for these settings.
    if let Some(known) = value.downcast_object_ref::<KnownTool>() {
        return known.json(&settings, |tool| settings.dumps(tool).map(Value::from));
    }
    settings.dumps(value).map(Value::from)
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {message}"))
}

/// One `json.dumps` call's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    indent: Option<String>,
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Settings {
    /// Python's defaults with `indent` spaces of indent.
    #[cfg(test)]
    pub(crate) fn indented(indent: usize) -> Self {
        Self {
            indent: Some(" ".repeat(indent)),
            item: ",".to_owned(),
            key: ": ".to_owned(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }

    /// `value`'s text.
    fn dumps(&self, value: &Value) -> Result<String, Error> {
        let mut dumps = Dumps {
            out: String::new(),
            settings: self,
        };
        dumps.value(value, 0)?;
        Ok(dumps.out)
    }
}

/// One `json.dumps` call's output as it is written.
struct Dumps<'s> {
    out: String,
    settings: &'s Settings,
}

impl Dumps<'_> {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(invalid("the value nests too deep"));
        }
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.open('[', items.len(), depth, |dumps, i| {
                    dumps.value(&items[i], depth + 1)
                })?;
                self.close(']', items.len(), depth);
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.settings.sort_keys {
                    keys.sort();
                }
                self.open('{', keys.len(), depth, |dumps, i| {
                    let key = &keys[i];
                    match key.as_str() {
                        Some(text) => dumps.string(text),
                        None => {
                            // Python writes a non-string key as the string of its JSON.
                            let mut inner = Dumps {
                                out: String::new(),
                                settings: dumps.settings,
                            };
                            inner.value(key, depth + 1)?;
                            dumps.string(&inner.out);
                        }
                    }
                    dumps.out.push_str(&dumps.settings.key);
                    dumps.value(&value.get_item(key)?, depth + 1)
                })?;
                self.close('}', keys.len(), depth);
            }
            ValueKind::Undefined => {
                return Err(invalid("Object of type Undefined is not JSON serializable"));
            }
            kind => {
                return Err(invalid(&format!(
                    "Object of kind {kind} is not JSON serializable"
                )));
            }
        }
        Ok(())
    }

    /// Writes `open` and each of `len` items, separated and indented as Python does.
    fn open(
        &mut self,
        open: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        for i in 0..len {
            if i > 0 {
                self.out.push_str(&self.settings.item);
            }
            self.newline(depth + 1);
            item(self, i)?;
        }
        Ok(())
    }

    fn close(&mut self, close: char, len: usize, depth: usize) {
        if len > 0 {
            self.newline(depth);
        }
        self.out.push(close);
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.settings.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn number(&mut self, value: &Value) -> Result<(), Error> {
        if value.is_integer() {
            match i128::try_from(value.clone()) {
                Ok(n) => write!(self.out, "{n}"),
                Err(_) => write!(self.out, "{}", u128::try_from(value.clone())?),
            }
            .map_err(|_| invalid("the number could not be written"))?;
            return Ok(());
        }
        let float = f64::try_from(value.clone())?;
        python_float(&mut self.out, float);
        Ok(())
    }

    fn string(&mut self, text: &str) {
        self.out.push('"');
        for c in text.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c if self.settings.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Writes `x` as Python's `repr(float)` (and so `json.dumps`) writes it: the shortest
/// digits that read back as `x`, in fixed notation with at least one decimal unless
/// the exponent is below -4 or above 15, `NaN` and `Infinity` as JSON's extension.
pub(super) fn python_float(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("NaN");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: `d.ddde±x`.
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("an exponent");
    let exponent: i32 = exponent.parse().expect("a number");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    // Python's `decpt`: where the decimal point falls after the first digit's place.
    let point = exponent + 1;
    if !(-3..=16).contains(&point) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    } else if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(&digits);
    } else {
        let point = point as usize;
        if digits.len() > point {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        } else {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(x: f64) -> String {
        let mut out = String::new();
        python_float(&mut out, x);
        out
    }

    #[test]
    fn floats_are_written_as_python_writes_them() {
        // Each right-hand side is Python 3.11's `json.dumps(x)`.
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e300, "1e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            (std::f64::consts::PI, "3.141592653589793"),
        ];
        for (x, python) in cases {
            assert_eq!(float(x), python, "{x:?}");
        }
    }
}
