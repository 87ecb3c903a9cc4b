-- shockslurm store schema (sqlite), generated from shockslurm/store/models.py
-- by `shockslurm db ddl`; do not edit by hand.

CREATE TABLE runs (
	id INTEGER NOT NULL,
	kind VARCHAR(16) NOT NULL,
	cluster VARCHAR(128) NOT NULL,
	policy VARCHAR(64) NOT NULL,
	started_at DATETIME NOT NULL,
	config JSON NOT NULL,
	CONSTRAINT pk_runs PRIMARY KEY (id)
);

CREATE TABLE jobs (
	id INTEGER NOT NULL,
	run_id INTEGER NOT NULL,
	job_id BIGINT NOT NULL,
	submit_s FLOAT NOT NULL,
	owner VARCHAR(128),
	model VARCHAR(128) NOT NULL,
	epochs INTEGER NOT NULL,
	samples_per_epoch BIGINT NOT NULL,
	batch_sizes JSON NOT NULL,
	gang_size INTEGER NOT NULL,
	report_key VARCHAR(64),
	CONSTRAINT pk_jobs PRIMARY KEY (id),
	CONSTRAINT uq_jobs_run_id_job_id_submit_s UNIQUE (run_id, job_id, submit_s),
	CONSTRAINT fk_jobs_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE INDEX ix_jobs_job_id ON jobs (job_id);

CREATE TABLE rounds (
	id INTEGER NOT NULL,
	run_id INTEGER NOT NULL,
	round_index INTEGER NOT NULL,
	time_s FLOAT NOT NULL,
	policy VARCHAR(64) NOT NULL,
	solve_s FLOAT NOT NULL,
	status VARCHAR(32),
	objective FLOAT,
	idle_switch_gpu_s FLOAT,
	idle_unplaceable_gpu_s FLOAT,
	idle_waiting_gpu_s FLOAT,
	CONSTRAINT pk_rounds PRIMARY KEY (id),
	CONSTRAINT uq_rounds_run_id_round_index UNIQUE (run_id, round_index),
	CONSTRAINT fk_rounds_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE TABLE batch_size_changes (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	time_s FLOAT NOT NULL,
	old_batch_size INTEGER NOT NULL,
	new_batch_size INTEGER NOT NULL,
	CONSTRAINT pk_batch_size_changes PRIMARY KEY (id),
	CONSTRAINT fk_batch_size_changes_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_batch_size_changes_job_pk ON batch_size_changes (job_pk);

CREATE TABLE checkpoints (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	time_s FLOAT NOT NULL,
	path TEXT NOT NULL,
	step BIGINT NOT NULL,
	ok BOOLEAN NOT NULL,
	CONSTRAINT pk_checkpoints PRIMARY KEY (id),
	CONSTRAINT fk_checkpoints_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_checkpoints_job_pk ON checkpoints (job_pk);

CREATE TABLE enactment_intents (
	id INTEGER NOT NULL,
	round_id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	action VARCHAR(32) NOT NULL,
	argv JSON NOT NULL,
	return_code INTEGER,
	stderr TEXT,
	created_at DATETIME NOT NULL,
	finished_at DATETIME,
	CONSTRAINT pk_enactment_intents PRIMARY KEY (id),
	CONSTRAINT fk_enactment_intents_round_id_rounds FOREIGN KEY(round_id) REFERENCES rounds (id) ON DELETE CASCADE,
	CONSTRAINT fk_enactment_intents_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_enactment_intents_job_pk ON enactment_intents (job_pk);

CREATE INDEX ix_enactment_intents_round_id ON enactment_intents (round_id);

CREATE TABLE job_events (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	time_s FLOAT NOT NULL,
	kind VARCHAR(32) NOT NULL,
	detail TEXT,
	CONSTRAINT pk_job_events PRIMARY KEY (id),
	CONSTRAINT fk_job_events_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_job_events_job_pk ON job_events (job_pk);

CREATE INDEX ix_job_events_job_pk_kind_id ON job_events (job_pk, kind, id);

CREATE TABLE plan_entries (
	id INTEGER NOT NULL,
	round_id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	gpus INTEGER NOT NULL,
	CONSTRAINT pk_plan_entries PRIMARY KEY (id),
	CONSTRAINT uq_plan_entries_round_id_job_pk UNIQUE (round_id, job_pk),
	CONSTRAINT fk_plan_entries_round_id_rounds FOREIGN KEY(round_id) REFERENCES rounds (id) ON DELETE CASCADE,
	CONSTRAINT fk_plan_entries_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE TABLE throughput_samples (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	time_s FLOAT NOT NULL,
	samples_per_s FLOAT NOT NULL,
	batch_size INTEGER NOT NULL,
	gpus INTEGER NOT NULL,
	CONSTRAINT pk_throughput_samples PRIMARY KEY (id),
	CONSTRAINT fk_throughput_samples_job_pk_jobs FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_throughput_samples_job_pk_id ON throughput_samples (job_pk, id);

CREATE INDEX ix_throughput_samples_job_pk_time_s ON throughput_samples (job_pk, time_s);
