/*
 * What the registry (registry.c) owns for the kinds it lists, so that a
 * kind reads it from one place: the -o keys of the etcd kind (known by
 * name even when etcd support is not built, so that fs/main.c can say
 * what they need) and the default local directory of every store.
 */
#ifndef LOCKFS_BACKEND_REGISTRY_H
#define LOCKFS_BACKEND_REGISTRY_H

/* The default -o backing=DIR: dir's lock directory, etcd's audit log and
 * pid lock; also for `lockfs --help`. */
#define LOCKFS_BACKEND_DEFAULT_BACKING "/run/lockfs"

/* The -o keys the etcd kind takes, NULL-terminated. */
extern const char *const lockfs_backend_etcd_option_keys[];

#endif
