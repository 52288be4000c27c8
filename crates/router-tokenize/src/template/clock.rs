//! The chat template's `strftime_now(format)`: the current UTC date and time in
//! Python's `strftime` notation, as templates that print today's date call it (the
//! engine renders the same date, but for a request that crosses midnight).

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A moment's calendar fields (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Moment {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    /// 0 is Monday.
    weekday: usize,
    /// 1 is the first of January.
    yearday: u32,
}

impl Moment {
    /// The moment `seconds` after the Unix epoch.
    pub(super) fn at(seconds: u64) -> Self {
        let days = (seconds / 86_400) as i64;
        let (year, month, day) = civil(days);
        let yearday = (days - days_from_civil(year, 1, 1)) as u32 + 1;
        Self {
            year,
            month,
            day,
            hour: seconds % 86_400 / 3_600,
            minute: seconds % 3_600 / 60,
            second: seconds % 60,
            // The epoch was a Thursday.
            weekday: ((days + 3).rem_euclid(7)) as usize,
            yearday,
        }
    }

    pub(super) fn now() -> Self {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::at(seconds)
    }

    /// `format` with its `%` directives replaced; an unknown one is kept as written,
    /// as Python's `strftime` keeps it.
    pub(super) fn format(&self, format: &str) -> String {
        let mut out = String::with_capacity(format.len() + 16);
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(mut directive) = chars.next() else {
                out.push('%');
                break;
            };
            // glibc's `-` flag, which Python passes through: no padding.
            let unpadded = directive == '-';
            if unpadded {
                match chars.next() {
                    Some(next) => directive = next,
                    None => {
                        out.push_str("%-");
                        break;
                    }
                }
            }
            let at = out.len();
            let month = MONTHS[self.month as usize - 1];
            let day = DAYS[self.weekday];
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            let _ = match directive {
                'Y' => write!(out, "{}", self.year),
                'y' => write!(out, "{:02}", self.year.rem_euclid(100)),
                'm' => write!(out, "{:02}", self.month),
                'd' => write!(out, "{:02}", self.day),
                'e' => write!(out, "{:2}", self.day),
                'j' => write!(out, "{:03}", self.yearday),
                'H' => write!(out, "{:02}", self.hour),
                'I' => write!(out, "{hour12:02}"),
                'M' => write!(out, "{:02}", self.minute),
                'S' => write!(out, "{:02}", self.second),
                'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
                'B' => write!(out, "{month}"),
                'b' | 'h' => write!(out, "{}", &month[..3]),
                'A' => write!(out, "{day}"),
                'a' => write!(out, "{}", &day[..3]),
                'u' => write!(out, "{}", self.weekday + 1),
                'w' => write!(out, "{}", (self.weekday + 1) % 7),
                'F' => write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day),
                'T' => write!(
                    out,
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                ),
                '%' => write!(out, "%"),
                other if unpadded => write!(out, "%-{other}"),
                other => write!(out, "%{other}"),
            };
            if unpadded
                && matches!(
                    directive,
                    'd' | 'm' | 'j' | 'H' | 'I' | 'M' | 'S' | 'y' | 'e'
                )
            {
                let written = out.split_off(at);
                let trimmed = written.trim_start_matches([' ', '0']);
                out.push_str(if trimmed.is_empty() { "0" } else { trimmed });
            }
        }
        out
    }
}

/// The (year, month, day) of the day `days` after 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The days from 1970-01-01 to the given date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_formatted_as_python_formats_them() {
        // Python: time.strftime(f, time.gmtime(1_788_739_199)) for each f.
        let moment = Moment::at(1_788_739_199);
        assert_eq!(moment.format("%d %b %Y"), "06 Sep 2026");
        assert_eq!(moment.format("%A, %B %-d"), "Sunday, September 6");
        assert_eq!(moment.format("%e|%-m|%Q|%-M"), " 6|9|%Q|59");
        assert_eq!(
            moment.format("%Y-%m-%dT%H:%M:%S %j %p %I"),
            "2026-09-06T23:59:59 249 PM 11"
        );
        assert_eq!(
            Moment::at(0).format("%a %F %T %w %u 100%%"),
            "Thu 1970-01-01 00:00:00 4 4 100%"
        );
        assert_eq!(Moment::at(0).format("%-H:%-M %I %p"), "0:0 12 AM");
        // A leap day, and the last day of a leap year.
        assert_eq!(Moment::at(951_782_400).format("%F %j"), "2000-02-29 060");
        assert_eq!(Moment::at(1_735_603_200).format("%F %j"), "2024-12-31 366");
    }
}
