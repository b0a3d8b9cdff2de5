//! What to do with one received message before any handler sees it: a pure
//! decision over its subject, body and delivery count.

use bytes::Bytes;
use prost::Message as _;
use runyard_events::Event;

/// The fate of one received message, decided before handling.
#[derive(Debug, Clone, PartialEq)]
// Made and taken apart once per message: boxing the event would cost an
// allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Triage {
    /// On the dead-letter subject: acknowledged, never handled (a consumer
    /// whose filter covers it must not dead-letter dead letters).
    Skip,
    /// A decoded event with an id, for the handler.
    Handle(Event),
    /// Undecodable or without id, with deliveries left: sent back with a
    /// short delay (a newer replica may understand it).
    Retry(String),
    /// Undecodable or without id on its last allowed delivery: dead-lettered.
    DeadLetter(String),
}

/// Decides what happens to a message on `subject` with `payload`, delivered
/// `delivered` times (1 = first), given `max_attempts` deliveries before an
/// undecodable message is dead-lettered.
pub(crate) fn triage(
    subject: &str,
    payload: Bytes,
    delivered: i64,
    max_attempts: u32,
    deadletter_subject: &str,
) -> Triage {
    if subject == deadletter_subject {
        return Triage::Skip;
    }
    let reason = match Event::decode(payload) {
        Ok(event) if !event.id.is_empty() => return Triage::Handle(event),
        Ok(_) => "event without id".to_owned(),
        Err(e) => format!("undecodable event: {e}"),
    };
    if delivered >= i64::from(max_attempts.max(1)) {
        Triage::DeadLetter(reason)
    } else {
        Triage::Retry(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DL: &str = "ns.v1.deadletter";

    fn encoded(id: &str) -> Bytes {
        Bytes::from(
            Event {
                id: id.into(),
                ..Event::default()
            }
            .encode_to_vec(),
        )
    }

    #[test]
    fn events_with_an_id_are_handled() {
        let t = triage("ns.v1.usage.github", encoded("e-1"), 1, 3, DL);
        assert!(matches!(t, Triage::Handle(e) if e.id == "e-1"));
    }

    #[test]
    fn undecodable_messages_are_retried_until_their_last_attempt() {
        let junk = Bytes::from_static(b"\xff\xff not protobuf");
        for delivered in 1..3 {
            let t = triage("ns.v1.job.github.queued", junk.clone(), delivered, 3, DL);
            assert!(
                matches!(&t, Triage::Retry(r) if r.starts_with("undecodable")),
                "{t:?}"
            );
        }
        for delivered in [3, 4, 100] {
            let t = triage("ns.v1.job.github.queued", junk.clone(), delivered, 3, DL);
            assert!(matches!(t, Triage::DeadLetter(r) if r.starts_with("undecodable")));
        }
    }

    #[test]
    fn events_without_id_count_as_undecodable() {
        assert_eq!(
            triage("ns.v1.allocation", encoded(""), 1, 2, DL),
            Triage::Retry("event without id".into())
        );
        assert_eq!(
            triage("ns.v1.allocation", encoded(""), 2, 2, DL),
            Triage::DeadLetter("event without id".into())
        );
        // At least one delivery even when told zero.
        assert_eq!(
            triage("ns.v1.allocation", encoded(""), 1, 0, DL),
            Triage::DeadLetter("event without id".into())
        );
    }

    #[test]
    fn dead_letters_are_skipped_whatever_they_hold() {
        assert_eq!(triage(DL, encoded("e-1"), 1, 3, DL), Triage::Skip);
        assert_eq!(
            triage(DL, Bytes::from_static(b"\xff"), 9, 3, DL),
            Triage::Skip
        );
    }
}
