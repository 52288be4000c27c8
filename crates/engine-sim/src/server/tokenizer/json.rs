//! The chat template's `tojson` filter as transformers registers it: Python's
//! `json.dumps(value, ensure_ascii=False)`, so a tool's schema reads in the prompt as
//! the engine's Python wrote it: `", "` between items, `": "` after keys, non-ASCII
//! text as it is, floats as Python's `repr`. Strings need nothing of their own:
//! serde_json escapes what Python escapes, as Python does (`\u001f`, lowercase).

use std::io;

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

/// `value | tojson`, with transformers' keyword arguments `indent` (a number of
/// spaces or a string; `none` for one line) and `ensure_ascii` (only `false`).
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(text) => text.to_owned(),
            None => {
                let width = i64::try_from(v).map_err(|_| {
                    Error::new(ErrorKind::InvalidOperation, "tojson: indent is a number")
                })?;
                " ".repeat(usize::try_from(width).unwrap_or(0))
            }
        }),
    };
    if kwargs.get::<Option<bool>>("ensure_ascii")? == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: the simulated engine writes only ensure_ascii=False",
        ));
    }
    kwargs.assert_all_used()?;
    dumps(value, indent.as_deref())
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
pub(super) fn dumps(value: &Value, indent: Option<&str>) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    let formatter = Python {
        indent: indent.map(str::as_bytes),
        depth: 0,
        has_value: false,
    };
    value.serialize(&mut Serializer::with_formatter(&mut out, formatter))?;
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// Writes JSON with Python's separators: `", "` and `": "` on one line, or `","`
/// and a newline with `indent` once per level.
struct Python<'a> {
    indent: Option<&'a [u8]>,
    depth: usize,
    /// Whether the innermost open array or object has an item (so its close goes
    /// on a line of its own when indenting).
    has_value: bool,
}

impl Python<'_> {
    /// Starts an item: a separator after the first, then its own line when
    /// indenting.
    fn item<W: ?Sized + io::Write>(&self, writer: &mut W, first: bool) -> io::Result<()> {
        match self.indent {
            None if first => Ok(()),
            None => writer.write_all(b", "),
            Some(indent) => {
                writer.write_all(if first { b"\n" } else { b",\n" })?;
                for _ in 0..self.depth {
                    writer.write_all(indent)?;
                }
                Ok(())
            }
        }
    }

    fn close<W: ?Sized + io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if let (Some(indent), true) = (self.indent, self.has_value) {
            writer.write_all(b"\n")?;
            for _ in 0..self.depth {
                writer.write_all(indent)?;
            }
        }
        writer.write_all(bracket)
    }
}

impl Formatter for Python<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(python_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }
}

/// A float as Python's `repr` writes it: the shortest digits that read back the
/// same, in positional form for exponents from -4 to 15 (always with a fractional
/// part), else as `d.ddde+XX`. Only finite values come here (serde_json writes the
/// others as `null`; a JSON body holds none).
fn python_float(value: f64) -> String {
    // Rust's `{:e}` writes the shortest round-tripping digits: `-1.25e-7`.
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("a decimal exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exponent) {
        if exponent < 0 {
            let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
            format!("0.{zeros}{digits}")
        } else {
            let point = usize::try_from(exponent).unwrap_or(0) + 1;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{first}{fraction}e{exponent_sign}{:02}", exponent.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).expect("JSON")
    }

    #[test]
    fn values_are_written_with_pythons_separators_in_the_given_order() {
        let value = json(r#"{"z": [1, -2, true, null], "a": {"é": "<tag> & \"q\"\n"}, "e": []}"#);
        assert_eq!(
            dumps(&value, None).unwrap(),
            r#"{"z": [1, -2, true, null], "a": {"é": "<tag> & \"q\"\n"}, "e": []}"#
        );
        assert_eq!(
            dumps(&json("\"\\u0001/\\t\""), None).unwrap(),
            "\"\\u0001/\\t\""
        );
    }

    #[test]
    fn indenting_puts_each_item_on_its_own_line() {
        let value = json(r#"{"a": [1, {}], "b": []}"#);
        assert_eq!(
            dumps(&value, Some("  ")).unwrap(),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
    }

    #[test]
    fn floats_read_as_pythons_repr() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.5, "0.5"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123_456.789, "123456.789"),
            (1.234_567_890_123_456_8e17, "1.2345678901234568e+17"),
        ];
        for (value, python) in cases {
            assert_eq!(python_float(value), python, "{value:e}");
        }
    }
}
