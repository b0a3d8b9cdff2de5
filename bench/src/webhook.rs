//! Signed GitHub `workflow_job` deliveries as the benchmarks post them to
//! ingest.

/// The webhook secret the benchmarks configure ingest with (as `openssl
/// rand -hex 32` makes them: runyard refuses weak secrets).
pub const SECRET: &str = "eb89231c58ed9fced922076eb9fe720d5c448dc36c9db1be8d433ce2d3f17f56";

/// The runyard-testkit fixture deliveries are made from: a queued
/// `workflow_job`.
pub const FIXTURE: &str = "github_workflow_job_queued.json";

/// The header naming a delivery.
pub const DELIVERY: &str = "x-github-delivery";

/// The header carrying a delivery's signature.
pub const SIGNATURE: &str = "x-hub-signature-256";

/// The headers every delivery of an organization's hook carries besides
/// its id, signature and user agent.
pub const HEADERS: [(&str, &str); 5] = [
    ("content-type", "application/json"),
    ("x-github-event", "workflow_job"),
    ("x-github-hook-id", "4242"),
    ("x-github-hook-installation-target-id", "33435682"),
    ("x-github-hook-installation-target-type", "organization"),
];

/// A unique, UUID-shaped delivery id: delivery `i` of `phase` of this
/// process.
pub fn delivery_id(phase: u64, i: u64) -> String {
    let run = u64::from(std::process::id());
    format!("{run:08x}-{phase:04x}-4000-8000-{i:012x}")
}

/// Whether ingest's answer says the delivery was one it had already seen.
pub fn is_duplicate(body: &[u8]) -> bool {
    body.windows(16).any(|w| w == b"\"duplicate\":true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_answers() {
        let id = delivery_id(3, 17);
        assert_eq!(id.len(), 36);
        assert!(id.ends_with("-0003-4000-8000-000000000011"));
        assert!(is_duplicate(br#"{"event_id":"x","duplicate":true}"#));
        assert!(!is_duplicate(br#"{"event_id":"x","duplicate":false}"#));
    }
}
