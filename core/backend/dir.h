/* The local-directory store (dir.c): the seed tool's `mkdir DIR/NAME.lock`
 * protocol behind lockfs/backend.h. */
#ifndef LOCKFS_BACKEND_DIR_H
#define LOCKFS_BACKEND_DIR_H

#include "lockfs/backend.h"
#include "registry.h"

/* Default paths, also for `lockfs --help`. */
#define LOCKFS_DIR_DEFAULT_BACKING LOCKFS_BACKEND_DEFAULT_BACKING
#define LOCKFS_DIR_DEFAULT_FENCE_DIR "/var/lib/lockfs"
#define LOCKFS_DIR_DEFAULT_FENCE_FILE LOCKFS_DIR_DEFAULT_FENCE_DIR "/fence"

extern const struct lockfs_backend_kind lockfs_backend_dir_kind;

#endif
