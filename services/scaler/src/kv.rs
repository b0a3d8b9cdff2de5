//! Coordination between scaler replicas in JetStream key/value buckets:
//! pool leases in `<NS>_LEASES` (the bucket's max age is the lease TTL; the
//! holder renews with a revision-checked update, a newcomer takes an expired
//! lease with `create`) and job claims in `<NS>_CLAIMS` (`create`, so one
//! claim wins; never deleted, kept 7 days).

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use runyard_bus::Bus;

/// Errors talking to the buckets.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The bucket could not be opened or created.
    #[error("opening bucket {bucket}: {message}")]
    Bucket {
        /// Which.
        bucket: String,
        /// Why.
        message: String,
    },
    /// A read or write failed (NATS down, timeout).
    #[error("{0}")]
    Io(String),
}

/// How a claim attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This call made the claim.
    Won,
    /// The job was claimed before, with this value.
    Held(String),
}

/// The two buckets.
#[derive(Clone, Debug)]
pub struct Coordination {
    leases: kv::Store,
    claims: kv::Store,
    replica: String,
}

/// Claims are kept this long (then a job can no longer be served).
pub const CLAIM_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

async fn bucket(
    bus: &Bus,
    name: String,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, KvError> {
    let js = bus.jetstream();
    if let Ok(store) = js.get_key_value(&name).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: name.clone(),
        history: 1,
        max_age,
        storage: async_nats::jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| KvError::Bucket {
        bucket: name,
        message: e.to_string(),
    })
}

impl Coordination {
    /// Opens (creating where missing) `<NS>_LEASES` with max age `lease_ttl`
    /// and `<NS>_CLAIMS`. `replica` names this process in lease values.
    pub async fn open(bus: &Bus, lease_ttl: Duration, replica: String) -> Result<Self, KvError> {
        Self::open_replicated(bus, lease_ttl, replica, 1).await
    }

    /// [`Coordination::open`], creating missing buckets with `replicas`
    /// replicas (existing buckets are left as they are).
    pub async fn open_replicated(
        bus: &Bus,
        lease_ttl: Duration,
        replica: String,
        replicas: usize,
    ) -> Result<Self, KvError> {
        let ns = bus.namespace().as_str().to_ascii_uppercase();
        Ok(Self {
            leases: bucket(bus, format!("{ns}_LEASES"), lease_ttl, replicas).await?,
            claims: bucket(bus, format!("{ns}_CLAIMS"), CLAIM_MAX_AGE, replicas).await?,
            replica,
        })
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Renews the lease on `pool` when `held` is the revision this replica
    /// holds, or takes it when it is free. The new revision when this replica
    /// holds the lease afterwards, `None` when another does.
    pub async fn lease(&self, pool: &str, held: Option<u64>) -> Result<Option<u64>, KvError> {
        let value = Bytes::from(self.replica.clone());
        if let Some(revision) = held {
            match self.leases.update(pool, value.clone(), revision).await {
                Ok(rev) => return Ok(Some(rev)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
                Err(e) => return Err(KvError::Io(e.to_string())),
            }
        }
        match self.leases.create(pool, value).await {
            Ok(rev) => Ok(Some(rev)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(KvError::Io(e.to_string())),
        }
    }

    /// Gives a lease up (on shutdown), so another replica takes the pool at
    /// once instead of after the TTL.
    pub async fn release(&self, pool: &str, held: u64) {
        // Deleting only if still ours: a revision-checked update to an empty
        // value, then the delete marker.
        if self.leases.update(pool, Bytes::new(), held).await.is_ok() {
            let _ = self.leases.delete(pool).await;
        }
    }

    /// Claims `key` for `value` (the runner name).
    pub async fn claim(&self, key: &str, value: &str) -> Result<Claim, KvError> {
        match self.claims.create(key, Bytes::from(value.to_owned())).await {
            Ok(_) => Ok(Claim::Won),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let held = self
                    .claims
                    .get(key)
                    .await
                    .map_err(|e| KvError::Io(e.to_string()))?
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                Ok(Claim::Held(held))
            }
            Err(e) => Err(KvError::Io(e.to_string())),
        }
    }

    /// How many claims the bucket holds.
    pub async fn claims_held(&self) -> Result<u64, KvError> {
        let store = self.claims.clone();
        let status = store
            .status()
            .await
            .map_err(|e| KvError::Io(e.to_string()))?;
        Ok(status.values())
    }
}
