/*
 * What the registry (registry.c) owns for the kinds it lists, so that a
 * kind reads it from one place: the default local directory of every
 * store.  (The etcd kind's -o keys, known by name even when etcd support
 * is not built, are options.h's: etcd.c's kind names them, and registry.c
 * names that kind.)
 */
#ifndef LOCKFS_BACKEND_REGISTRY_H
#define LOCKFS_BACKEND_REGISTRY_H

/* The default -o backing=DIR: dir's lock directory, etcd's audit log and
 * pid lock; also for `lockfs --help`. */
#define LOCKFS_BACKEND_DEFAULT_BACKING "/run/lockfs"

#endif
