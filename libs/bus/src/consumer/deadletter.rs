//! The dead-letter message: the original body on `<ns>.v1.deadletter` with
//! why and where it came from, deduplicated by the original's sequence.

use bytes::Bytes;

use crate::Outgoing;

/// Header: why the message was dead-lettered (control characters replaced,
/// at most 512 characters).
pub const REASON_HEADER: &str = "Runyard-Deadletter-Reason";
/// Header: the subject the message was published on.
pub const ORIGINAL_SUBJECT_HEADER: &str = "Runyard-Original-Subject";
/// Header: the stream sequence of the original message.
pub const ORIGINAL_SEQUENCE_HEADER: &str = "Runyard-Original-Sequence";
/// Header: set (to the original body's size in bytes) when the body had to
/// be left out because the dead letter would exceed the server's
/// `max_payload`.
pub const PAYLOAD_DROPPED_HEADER: &str = "Runyard-Deadletter-Payload-Dropped";

/// Longest reason kept in [`REASON_HEADER`], in characters.
const MAX_REASON: usize = 512;

/// `reason` made fit for a header: control characters (CR, LF, ...) become
/// spaces and it is cut at [`MAX_REASON`] characters.
pub(crate) fn clean_reason(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect()
}

/// The dead letter of the message at stream sequence `seq`, published on
/// `subject` with `payload`. Its dedup id is `deadletter:<seq>`, so dead
/// letters of one message published twice (a redelivery) are stored once.
pub(crate) fn message(
    deadletter_subject: &str,
    seq: u64,
    subject: &str,
    payload: Bytes,
    reason: &str,
) -> Outgoing {
    Outgoing {
        subject: deadletter_subject.to_owned(),
        id: format!("deadletter:{seq}"),
        headers: vec![
            (REASON_HEADER.into(), clean_reason(reason)),
            (ORIGINAL_SUBJECT_HEADER.into(), subject.to_owned()),
            (ORIGINAL_SEQUENCE_HEADER.into(), seq.to_string()),
        ],
        payload,
    }
}

/// The same dead letter without its body, saying how large the body was:
/// for an original so close to `max_payload` that the headers tip it over.
pub(crate) fn without_payload(mut msg: Outgoing) -> Outgoing {
    let size = msg.payload.len();
    msg.payload = Bytes::new();
    msg.headers
        .push((PAYLOAD_DROPPED_HEADER.into(), size.to_string()));
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_reason_origin_and_a_dedup_id_per_sequence() {
        let m = message(
            "ns.v1.deadletter",
            42,
            "ns.v1.job.github.queued",
            Bytes::from_static(b"body"),
            "bad\r\nthing",
        );
        assert_eq!(m.subject, "ns.v1.deadletter");
        assert_eq!(m.id, "deadletter:42");
        assert_eq!(m.payload.as_ref(), b"body");
        let header = |k: &str| {
            m.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header(REASON_HEADER), Some("bad  thing"));
        assert_eq!(
            header(ORIGINAL_SUBJECT_HEADER),
            Some("ns.v1.job.github.queued")
        );
        assert_eq!(header(ORIGINAL_SEQUENCE_HEADER), Some("42"));
        assert_eq!(header(PAYLOAD_DROPPED_HEADER), None);

        let dropped = without_payload(m);
        assert!(dropped.payload.is_empty());
        assert!(
            dropped
                .headers
                .contains(&(PAYLOAD_DROPPED_HEADER.into(), "4".into()))
        );
    }

    #[test]
    fn long_reasons_are_cut() {
        let long = "é".repeat(2000);
        assert_eq!(clean_reason(&long).chars().count(), MAX_REASON);
    }
}
