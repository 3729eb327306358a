/*
 * For unit tests only (tests/fixtures/engine_harness.c): what engine.c shows
 * of its insides, so that a test calls the liveness thread's entry points
 * (lock/recovery.h, lock/changes.h) itself, one step at a time, instead
 * of starting the thread.  Nothing in core/ or fs/ calls it: the floors
 * below engine.c never reach up to it.
 */
#ifndef LOCKFS_ENGINE_TEST_H
#define LOCKFS_ENGINE_TEST_H

struct lockfs_core;
struct lockfs_table;

/* CORE's table (lock/table.h), valid until lockfs_core_close. */
struct lockfs_table *lockfs_core_table(struct lockfs_core *core);

#endif
