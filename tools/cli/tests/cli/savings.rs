//! `runyard savings` on a small projection whose figures are worked out by
//! hand below.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use runyard_testkit::TestDb;
use serde_json::Value;

/// Two projects. acme/app (GitHub): job 1 ran 1 h at a 4 GB limit peaking
/// at 1 GB; job 2 was OOM-killed at 2 GB after 30 min and re-run as job 3
/// (attempt 2, 4 GB limit, 2.5 GB peak, 30 min, success). ci/spack
/// (GitLab): job 10 ran 2 h at 8 GB peaking at 6 GB; job 11 is in the
/// pipeline runyard made as a retry (8 GB, 3 GB, 1 h). Job 12 reported 40
/// days ago: outside the window. Two runners: one 62 min with a 60 min
/// job, one never assigned for 10 min.
const FIXTURE: &str = "
INSERT INTO jobs (forge, instance, job_id, status, project, pipeline_id, conclusion,
                  queued_at, started_at, completed_at,
                  first_seen_at, last_event_at, rank_status, rank_at, rank_event) VALUES
 ('github','github.com',1,4,'acme/app',NULL,'success', now()-interval '2 hours', now()-interval '2 hours'+interval '60 s', now()-interval '1 hour'+interval '60 s', now(),now(),4,now(),'e1'),
 ('github','github.com',2,4,'acme/app',NULL,'failure', now()-interval '1 hour', now()-interval '1 hour'+interval '120 s', now()-interval '30 min', now(),now(),4,now(),'e2'),
 ('github','github.com',3,4,'acme/app',NULL,'success', now()-interval '20 min', now()-interval '20 min'+interval '30 s', now(), now(),now(),4,now(),'e3'),
 ('gitlab','gitlab.example.com',10,4,'ci/spack',100,'success', now()-interval '5 hours', now()-interval '5 hours'+interval '300 s', now()-interval '3 hours', now(),now(),4,now(),'e10'),
 ('gitlab','gitlab.example.com',11,4,'ci/spack',101,'success', now()-interval '2 hours', now()-interval '2 hours'+interval '10 s', now()-interval '1 hour', now(),now(),4,now(),'e11');
INSERT INTO usage_samples (forge, instance, job_id, attempt, event_id, project, workload, workload_key,
                           peak_memory_bytes, memory_limit_bytes, cpu_seconds, wall_seconds, oom_killed, reported_at) VALUES
 ('github','github.com',1,1,'u1','acme/app','{}','k',1000000000,4000000000,1,3600,false,now()-interval '1 hour'),
 ('github','github.com',2,1,'u2','acme/app','{}','k',2000000000,2000000000,1,1800,true,now()-interval '30 min'),
 ('github','github.com',3,2,'u3','acme/app','{}','k',2500000000,4000000000,1,1800,false,now()),
 ('gitlab','gitlab.example.com',10,1,'u10','ci/spack','{}','s',6000000000,8000000000,1,7200,false,now()-interval '3 hours'),
 ('gitlab','gitlab.example.com',11,1,'u11','ci/spack','{}','s',3000000000,8000000000,1,3600,false,now()-interval '1 hour'),
 ('gitlab','gitlab.example.com',12,1,'u12','ci/spack','{}','s',9000000000,9000000000,1,3600,true,now()-interval '40 days');
INSERT INTO retries (event_id, kind, forge, instance, unit, project, strategy, new_pipeline_id, new_job_ids, jobs, occurred_at, received_at) VALUES
 ('retry:github:github.com:job:2:1:issued','issued','github','github.com','job:2:1','acme/app','rerun_job',NULL,'[3]','[]',now()-interval '25 min',now()),
 ('retry:gitlab:gitlab.example.com:pipeline:100:issued','issued','gitlab','gitlab.example.com','pipeline:100','ci/spack','pipeline',101,'[11]','[]',now()-interval '2 hours',now());
INSERT INTO runners (name, pool, job_forge, job_instance, job_id, created_at, assigned_at, deleted_at,
                     first_seen_at, last_event_at, ref_event) VALUES
 ('ry-a-1','a','github','github.com',1, now()-interval '2 hours', now()-interval '2 hours'+interval '60 s', now()-interval '1 hour'+interval '120 s', now(),now(),'r1'),
 ('ry-a-2','a',NULL,NULL,NULL, now()-interval '30 min', NULL, now()-interval '20 min', now(),now(),'r2');
";

async fn savings(db: &TestDb, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"))
        .env_clear()
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .env("RUNYARD_DATABASE_URL", &db.url)
        .arg("savings")
        .args(args)
        .output()
        .await
        .unwrap()
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 0.01)
}

#[tokio::test]
async fn savings_match_the_figures_worked_out_by_hand() {
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::raw_sql(FIXTURE).execute(&pool).await.unwrap();
    pool.close().await;

    let o = savings(&db, &["--since", "30d", "--before-memory", "8GB", "--json"]).await;
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = &r["total"];
    // Reserved: 4·1 + 2·0.5 + 4·0.5 + 8·2 + 8·1 = 31 GB·h; used 1 + 1 +
    // 1.25 + 12 + 3 = 18.25; before: 5 h at 8 GB = 40.
    assert_eq!(t["reports"], 5, "{r:#}");
    assert!(close(&t["reserved_gb_hours"], 31.0), "{r:#}");
    assert!(close(&t["used_gb_hours"], 18.25), "{r:#}");
    assert!(close(&t["before_gb_hours"], 40.0), "{r:#}");
    // First attempts: jobs 1, 2 and 10 (job 3 is attempt 2, job 11 in a
    // retry pipeline); one killed.
    assert_eq!(
        (
            t["first_attempts"].clone(),
            t["first_attempts_oom_killed"].clone()
        ),
        (3.into(), 1.into())
    );
    assert!(close(&t["first_attempt_oom_rate"], 1.0 / 3.0), "{r:#}");
    assert_eq!(
        (t["retries"].clone(), t["retries_succeeded"].clone()),
        (2.into(), 2.into())
    );
    // Waits 10, 30, 60, 120, 300 s: median 60, 95th 120 + 0.8·180 = 264.
    assert!(close(&t["queue_wait_p50_seconds"], 60.0), "{r:#}");
    assert!(close(&t["queue_wait_p95_seconds"], 264.0), "{r:#}");
    // Runners: 62 + 10 minutes, of which 2 + 10 idle.
    assert!(close(&r["runners"]["runner_minutes"], 72.0), "{r:#}");
    assert!(close(&r["runners"]["idle_runner_minutes"], 12.0), "{r:#}");

    let projects: Vec<&Value> = r["projects"].as_array().unwrap().iter().collect();
    assert_eq!(projects.len(), 2, "{r:#}");
    let app = projects
        .iter()
        .find(|p| p["project"] == "acme/app")
        .unwrap();
    assert!(close(&app["reserved_gb_hours"], 7.0), "{r:#}");
    assert!(close(&app["first_attempt_oom_rate"], 0.5), "{r:#}");
    let spack = projects
        .iter()
        .find(|p| p["project"] == "ci/spack")
        .unwrap();
    assert!(close(&spack["reserved_gb_hours"], 24.0), "{r:#}");
    assert_eq!(spack["first_attempts"], 1, "{r:#}");
    assert!(close(&spack["queue_wait_p50_seconds"], 155.0), "{r:#}");
    assert!(
        r["how"]["reserved_gb_hours"]
            .as_str()
            .unwrap()
            .contains("memory_limit_bytes")
    );

    // The table for people names every figure's method.
    let o = savings(&db, &["--since", "30d"]).await;
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("(all)") && text.contains("how:"), "{text}");

    // A bad window or size is refused, naming it.
    let o = savings(&db, &["--since", "30x"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("30x"));
    let o = savings(&db, &["--before-memory", "lots"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lots"));
    db.drop_db().await;
}
