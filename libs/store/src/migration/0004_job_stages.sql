-- A job's observations are ranked by lifecycle stage, not by status:
-- 1 GitLab `created` (not runnable, never after anything else), 2 `queued`
-- and `waiting` (they alternate: an approval, a resource group, a schedule;
-- the later observation wins, by `rank_at`), 3 `in_progress`, 4 `completed`.
-- `status` is the status of the highest-ranked observation.
UPDATE jobs SET status = 2
 WHERE forge = 'gitlab' AND forge_status = 'created' AND status = 1;
UPDATE jobs SET rank_status = CASE
        WHEN forge = 'gitlab' AND forge_status = 'created' AND status = 2 THEN 1
        ELSE 2
    END
 WHERE rank_status IN (1, 2);
COMMENT ON COLUMN jobs.status IS
    'status of the highest-ranked observation: 1 queued, 2 waiting, 3 in_progress, 4 completed';
COMMENT ON COLUMN jobs.rank_status IS
    'lifecycle stage of that observation: 1 created (GitLab), 2 queued or waiting, 3 in_progress, 4 completed';
