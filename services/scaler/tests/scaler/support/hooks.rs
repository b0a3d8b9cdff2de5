//! The fake forges' webhooks, published as ingest publishes them: each
//! delivery goes through the forge's own normalizer (the code ingest runs),
//! so the events carry what the real payloads say.

use runyard_forge::{
    GithubDelivery, GitlabDelivery, Normalized, normalize_github, normalize_gitlab,
};
use runyard_testkit::fake_github::FakeWebhook;
use runyard_testkit::fake_gitlab::FakeGlWebhook;

use super::Stack;

/// The instance the fake GitLab's hooks name (`X-Gitlab-Instance`).
pub const GITLAB_INSTANCE: &str = "https://gitlab.example.com";

impl Stack {
    /// Publishes GitHub deliveries in the order they were sent.
    pub async fn deliver_github(&self, hooks: Vec<FakeWebhook>) {
        for h in hooks {
            let d = GithubDelivery {
                event: Some(&h.event),
                delivery_id: Some(&h.guid),
                hook_id: Some("1"),
                enterprise_host: None,
                content_type: Some("application/json"),
                body: &h.body,
                received_at: time::OffsetDateTime::now_utc(),
            };
            self.publish_normalized(normalize_github(&d).expect("a valid delivery"))
                .await;
        }
    }

    /// Publishes GitLab deliveries in the order they were sent.
    pub async fn deliver_gitlab(&self, hooks: Vec<FakeGlWebhook>) {
        for h in hooks {
            let d = GitlabDelivery {
                event: Some(&h.event),
                idempotency_key: Some(&h.uuid),
                event_uuid: Some(&h.uuid),
                webhook_uuid: Some("hook-1"),
                instance: Some(GITLAB_INSTANCE),
                content_type: Some("application/json"),
                body: &h.body,
                received_at: time::OffsetDateTime::now_utc(),
            };
            self.publish_normalized(normalize_gitlab(&d).expect("a valid delivery"))
                .await;
        }
    }

    async fn publish_normalized(&self, n: Normalized) {
        if let Normalized::Events(events) = n {
            for e in events {
                self.publish(e).await;
            }
        }
    }
}
