/*
 * The startup scan (startup.c): every lock the store holds when the
 * daemon starts is read, cached and watched; fd locks are rebound to the
 * processes holding their old descriptors (rebound.h); then what died
 * meanwhile is recovered (recovery.h); then, with a store of sessions
 * (etcd), what lives on is adopted into this daemon's session.
 */
#ifndef LOCKFS_LOCK_STARTUP_H
#define LOCKFS_LOCK_STARTUP_H

#include "table.h"

/* In lockfs_core_open, before the liveness thread runs.  0 or -errno
 * (the store could not be listed). */
int lockfs_startup_scan(struct lockfs_table *t);

#endif
