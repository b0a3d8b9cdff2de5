//! The timestamp formats the forges send, and the plausibility window every
//! timestamp must fall into.

use time::format_description::well_known::Rfc3339;
use time::macros::{datetime, format_description};
use time::{Duration, OffsetDateTime, PrimitiveDateTime, UtcOffset};

/// Nothing runyard observes predates this; an earlier time is a broken
/// payload (or a zero value from some serializer), not history.
const EARLIEST: OffsetDateTime = datetime!(2000-01-01 00:00:00 UTC);

/// How far past `received_at` a forge's clock may run. Forge clocks drift and
/// GitLab batches hooks, but a time days ahead would make the projection
/// believe a job finished in the future.
const MAX_SKEW: Duration = Duration::DAY;

/// Parses the timestamp formats GitHub and GitLab use:
///
/// - RFC 3339 (`2024-01-01T12:00:00Z`, `2021-02-23T02:41:37.886Z`): GitHub,
///   and GitLab's `*_iso` fields and newer payloads;
/// - `2024-01-01 12:00:00 UTC`: Ruby's `Time#to_s` in UTC, which most GitLab
///   hook timestamps use;
/// - `2024-01-01 12:00:00 +0100`: the same for instances configured with a
///   non-UTC time zone.
///
/// Fractional seconds are accepted in the GitLab forms as well.
pub(crate) fn parse(s: &str) -> Option<OffsetDateTime> {
    let s = s.trim();
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Some(t);
    }
    let local = format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]"
    );
    if let Some(naive) = s.strip_suffix(" UTC") {
        return PrimitiveDateTime::parse(naive, &local)
            .ok()
            .map(PrimitiveDateTime::assume_utc);
    }
    // `... +0100` / `... -05:30`: split off the offset so one description
    // serves both offset spellings.
    let (naive, offset) = s.rsplit_once(' ')?;
    let offset = parse_offset(offset)?;
    PrimitiveDateTime::parse(naive, &local)
        .ok()
        .map(|t| t.assume_offset(offset))
}

/// `+0100`, `-05:30`.
fn parse_offset(s: &str) -> Option<UtcOffset> {
    let compact = format_description!("[offset_hour sign:mandatory][offset_minute]");
    let colon = format_description!("[offset_hour sign:mandatory]:[offset_minute]");
    UtcOffset::parse(s, &compact)
        .or_else(|_| UtcOffset::parse(s, &colon))
        .ok()
}

/// Rejects timestamps outside `[2000-01-01, received_at + 1 day]`.
pub(crate) fn check(
    t: OffsetDateTime,
    received_at: OffsetDateTime,
) -> Result<OffsetDateTime, &'static str> {
    if t < EARLIEST {
        return Err("before 2000-01-01");
    }
    // `checked_add` only fails for a `received_at` at the end of time, where
    // there is nothing left to be "in the future" of.
    match received_at.checked_add(MAX_SKEW) {
        Some(latest) if t > latest => Err("more than a day after the delivery was received"),
        _ => Ok(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_forge_format() {
        let noon = datetime!(2024-01-01 12:00:00 UTC);
        for s in [
            "2024-01-01T12:00:00Z",
            "2024-01-01T13:00:00+01:00",
            "2024-01-01 12:00:00 UTC",
            "2024-01-01 13:00:00 +0100",
            "2024-01-01 06:30:00 -05:30",
            " 2024-01-01 12:00:00 UTC ",
        ] {
            assert_eq!(parse(s), Some(noon), "{s}");
        }
        assert_eq!(
            parse("2021-02-23T02:41:37.886Z"),
            Some(datetime!(2021-02-23 02:41:37.886 UTC))
        );
        assert_eq!(
            parse("2021-02-23 02:41:37.5 UTC"),
            Some(datetime!(2021-02-23 02:41:37.5 UTC))
        );
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "yesterday",
            "2024-01-01",
            "2024-13-01 12:00:00 UTC",
            "2024-01-01 25:00:00 UTC",
            "2024-01-01 12:00:00 CET",
            "2024-01-01 12:00:00 +99",
            "2024-01-01T12:00:00",
            "1704110400",
        ] {
            assert_eq!(parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn window_is_2000_to_a_day_after_receipt() {
        let rx = datetime!(2024-01-01 12:00:00 UTC);
        assert!(check(datetime!(1999-12-31 23:59:59 UTC), rx).is_err());
        assert!(check(EARLIEST, rx).is_ok());
        assert!(check(rx + Duration::DAY, rx).is_ok());
        assert!(check(rx + Duration::DAY + Duration::SECOND, rx).is_err());
        // No overflow at the end of representable time.
        let end = datetime!(9999-12-31 23:59:59 UTC);
        assert!(check(end, end).is_ok());
    }
}
