//! The cron schedules of disruption budgets, read as upstream reads them: five fields (minute,
//! hour, day of month, month, day of week) or a macro (`@daily`, `@hourly`, ...), in UTC. Fields
//! take `*` (or `?`), numbers, `a-b` ranges, lists, `/step` (`a/step` runs from `a` to the end),
//! and month and weekday names (`JAN`, `MON`). When both day fields are restricted, a day matches
//! either; when one is `*`, both must match.

use std::time::Duration;

use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp, ToSpan};
use thiserror::Error;

/// A schedule that does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid schedule {schedule:?}: {reason}")]
pub struct ScheduleError {
    /// The schedule as written.
    pub schedule: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Whether the day-of-month field was `*`.
    any_day: bool,
    /// Whether the day-of-week field was `*`.
    any_weekday: bool,
}

struct Field {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field { min: 0, max: 59, names: &[] };
const HOUR: Field = Field { min: 0, max: 23, names: &[] };
const DAY: Field = Field { min: 1, max: 31, names: &[] };
const MONTH: Field = Field {
    min: 1,
    max: 12,
    names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
};
const WEEKDAY: Field = Field { min: 0, max: 6, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

impl Field {
    fn value(&self, s: &str) -> Result<u32, String> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(self.min + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
        if v < self.min || v > self.max {
            return Err(format!("{v} is outside {}-{}", self.min, self.max));
        }
        Ok(v)
    }

    /// The bits of one field, and whether it was a bare `*`.
    fn parse(&self, s: &str) -> Result<(u64, bool), String> {
        let mut bits = 0u64;
        let mut star = false;
        for part in s.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, step)) => {
                    let step: u32 = step.parse().map_err(|_| format!("{step:?} is not a step"))?;
                    if step == 0 {
                        return Err("a step of 0".into());
                    }
                    (r, Some(step))
                }
                None => (part, None),
            };
            let (start, end) = if range == "*" || range == "?" {
                star = star || step.is_none_or(|s| s == 1);
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                (self.value(a)?, self.value(b)?)
            } else {
                let v = self.value(range)?;
                // `a/step` runs from `a` to the end of the field.
                (v, if step.is_some() { self.max } else { v })
            };
            if start > end {
                return Err(format!("{range:?} runs backwards"));
            }
            let step = step.unwrap_or(1);
            let mut v = start;
            while v <= end {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, star))
    }
}

impl Schedule {
    /// Parses a schedule.
    pub fn parse(schedule: &str) -> Result<Schedule, ScheduleError> {
        let error = |reason: String| ScheduleError { schedule: schedule.to_string(), reason };
        let expanded = match schedule.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => return Err(error(format!("unknown macro {other:?}"))),
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(error(format!("expected 5 fields, found {}", fields.len())));
        };
        let (minutes, _) = MINUTE.parse(minute).map_err(error)?;
        let (hours, _) = HOUR.parse(hour).map_err(error)?;
        let (days, any_day) = DAY.parse(day).map_err(error)?;
        let (months, _) = MONTH.parse(month).map_err(error)?;
        let (weekdays, any_weekday) = WEEKDAY.parse(weekday).map_err(error)?;
        Ok(Schedule {
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: weekdays as u8,
            any_day,
            any_weekday,
        })
    }

    fn day_matches(&self, t: DateTime) -> bool {
        let day = self.days & (1 << t.day()) != 0;
        let weekday = self.weekdays & (1 << t.weekday().to_sunday_zero_offset()) != 0;
        if self.any_day || self.any_weekday { day && weekday } else { day || weekday }
    }

    /// Whether the schedule fires at the minute `t` (UTC) starts.
    pub fn fires_at(&self, t: DateTime) -> bool {
        self.months & (1 << t.month()) != 0
            && self.day_matches(t)
            && self.hours & (1 << t.hour()) != 0
            && self.minutes & (1 << t.minute()) != 0
    }

    /// Whether the schedule fired within the `duration` up to `now`: after `now - duration`, at or
    /// before `now`. This is when a budget with this schedule and duration is active.
    pub fn active(&self, now: Timestamp, duration: Duration) -> bool {
        let Ok(duration) = SignedDuration::try_from(duration) else { return true };
        let Ok(from) = now.checked_sub(duration) else { return true };
        let utc = |t: Timestamp| t.to_zoned(TimeZone::UTC).datetime();
        let end = utc(now);
        // The first whole minute after `from`.
        let Ok(mut t) = utc(from).with().second(0).subsec_nanosecond(0).build() else { return false };
        t = match t.checked_add(1.minute()) {
            Ok(t) => t,
            Err(_) => return false,
        };
        while t <= end {
            let next = if !(self.months & (1 << t.month()) != 0 && self.day_matches(t)) {
                // Not this day: the next one.
                t.date().tomorrow().map(|d| d.to_datetime(k8s_openapi::jiff::civil::Time::midnight()))
            } else if self.hours & (1 << t.hour()) == 0 {
                t.with().minute(0).build().and_then(|h| h.checked_add(1.hour()))
            } else if self.minutes & (1 << t.minute()) != 0 {
                return true;
            } else {
                t.checked_add(1.minute())
            };
            match next {
                Ok(n) => t = n,
                Err(_) => return false,
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn fields_macros_and_names() {
        let weekdays_9_to_5 = Schedule::parse("0 9 * * mon-fri").unwrap();
        assert!(weekdays_9_to_5.fires_at("2026-11-24T09:00".parse().unwrap()), "a Tuesday");
        assert!(!weekdays_9_to_5.fires_at("2026-11-22T09:00".parse().unwrap()), "a Sunday");
        assert!(!weekdays_9_to_5.fires_at("2026-11-24T09:01".parse().unwrap()));
        assert_eq!(Schedule::parse("@daily").unwrap(), Schedule::parse("0 0 * * *").unwrap());
        assert_eq!(Schedule::parse("@midnight").unwrap(), Schedule::parse("0 0 * * *").unwrap());
        let steps = Schedule::parse("*/15 0-6/3 1,15 JAN,jul ?").unwrap();
        assert!(steps.fires_at("2026-07-15T03:45".parse().unwrap()));
        assert!(!steps.fires_at("2026-07-15T04:45".parse().unwrap()));
        assert!(!steps.fires_at("2026-02-15T03:45".parse().unwrap()));
        // `a/step` runs to the end of the field.
        let from_ten = Schedule::parse("10/20 * * * *").unwrap();
        assert!(from_ten.fires_at("2026-01-01T00:50".parse().unwrap()));
        assert!(!from_ten.fires_at("2026-01-01T00:00".parse().unwrap()));
    }

    #[test]
    fn restricted_day_fields_match_either_day() {
        // The 1st of the month or any Monday.
        let s = Schedule::parse("0 0 1 * 1").unwrap();
        assert!(s.fires_at("2026-12-01T00:00".parse().unwrap()), "the 1st, a Tuesday");
        assert!(s.fires_at("2026-11-30T00:00".parse().unwrap()), "a Monday");
        assert!(!s.fires_at("2026-11-24T00:00".parse().unwrap()));
        // With `*` in one of them, both must match.
        let s = Schedule::parse("0 0 * * 1").unwrap();
        assert!(!s.fires_at("2026-12-01T00:00".parse().unwrap()));
    }

    #[test]
    fn bad_schedules_say_why() {
        for (bad, why) in [
            ("0 0 * *", "expected 5 fields"),
            ("60 0 * * *", "outside 0-59"),
            ("0 0 * * 7", "outside 0-6"),
            ("@often", "unknown macro"),
            ("*/0 * * * *", "step of 0"),
            ("0 5-2 * * *", "backwards"),
            ("0 0 * foo *", "not a number"),
        ] {
            let error = Schedule::parse(bad).unwrap_err();
            assert!(error.to_string().contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn active_after_each_start_for_the_duration() {
        let daily = Schedule::parse("@daily").unwrap();
        let hour = Duration::from_secs(3600);
        assert!(daily.active(at("2026-11-24T00:00:00Z"), hour), "at the start");
        assert!(daily.active(at("2026-11-24T00:59:59Z"), hour));
        assert!(!daily.active(at("2026-11-24T01:00:00Z"), hour), "the window is (now - duration, now]");
        assert!(!daily.active(at("2026-11-23T23:59:59Z"), hour));
        // A long window spans days; a weekly one found days back.
        let weekly = Schedule::parse("0 22 * * fri").unwrap();
        assert!(
            weekly.active(at("2026-11-23T08:00:00Z"), Duration::from_secs(60 * 3600)),
            "from Friday 22:00"
        );
        assert!(!weekly.active(at("2026-11-24T08:00:00Z"), Duration::from_secs(60 * 3600)));
    }
}
