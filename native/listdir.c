/* The pack's listing of directories (included by dsnative.c).
 *
 * list_dirs(paths, prefixes, stat=True, threads=1) -> [(paths, stats, dirs, others, entries, device, inode), ...]
 *
 * Reads each directory of `paths` and stats its regular files (by d_type, or by the stat
 * where the filesystem gives none), all of them with the GIL released once (a call a
 * directory handed the GIL back and forth a thousand times for a tree of a thousand
 * class folders), then hands each back as columns, in byte order of the names (so that
 * the caller's sort by path is a merge of sorted runs): `paths`, its prefix + name a file
 * (the one object built a file: a tuple, a location and four ints a file held the GIL
 * as long as the kernel took to list them); `stats`, bytes of four native int64 a file:
 * size, mtime ns, inode, ctime ns. `dirs` names the entries the directory says are
 * directories (d_type: no symlink among them), `others` every other entry that is not a
 * regular file (a symlink, a FIFO, an entry without d_type that is not a regular file, a
 * file gone or changed into something else between the read and the stat), for the
 * caller's own rules; `entries` counts every entry but "." and ".."; `device` and
 * `inode` are the directory's own (for the caller's loop check). With `stat` false, an
 * entry that d_type says is a regular file is taken as one without a stat, and its four
 * numbers are 0 (the digest's walk: the hashing stats each file it opens); an entry
 * without d_type is still stat'ed. With `threads` > 1 the directories are read on that
 * many threads of this call (POSIX threads started and joined inside it: the process has
 * no thread of it once the call returns, so it may still fork). An error opening or
 * reading a directory is raised as OSError with its errno and path, the first in order.
 * Names are decoded as os.fsdecode does.
 */
#include <dirent.h>
#include <pthread.h>

typedef struct {
    char *names;      /* every name, NUL-terminated, one after the other */
    size_t used, cap; /* bytes of `names` */
    struct listed {
        size_t name; /* offset into names */
        size_t length;
        int regular; /* 1 a regular file, 2 a directory by d_type, 0 anything else */
        long long size, mtime_ns, inode, ctime_ns;
    } *rows;
    size_t count, rows_cap;
    long long device, inode; /* the directory's */
} listing;

static int by_name(const void *a, const void *b, void *names) {
    return strcmp((const char *)names + ((const struct listed *)a)->name,
                  (const char *)names + ((const struct listed *)b)->name);
}

static int listing_add(listing *l, const char *name, size_t length) {
    if (l->used + length + 1 > l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1 << 16;
        while (cap < l->used + length + 1) cap *= 2;
        char *grown = realloc(l->names, cap);
        if (grown == NULL) return ENOMEM;
        l->names = grown;
        l->cap = cap;
    }
    if (l->count == l->rows_cap) {
        size_t cap = l->rows_cap ? l->rows_cap * 2 : 256;
        struct listed *grown = realloc(l->rows, cap * sizeof(struct listed));
        if (grown == NULL) return ENOMEM;
        l->rows = grown;
        l->rows_cap = cap;
    }
    memcpy(l->names + l->used, name, length + 1);
    struct listed *row = &l->rows[l->count++];
    memset(row, 0, sizeof(*row));
    row->name = l->used;
    row->length = length;
    l->used += length + 1;
    return 0;
}

/* 0, or the errno of opening or reading the directory. */
static int read_listing(const char *path, listing *l, int with_stat) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct stat self;
    if (fstat(fd, &self) != 0) {
        int e = errno;
        close(fd);
        return e;
    }
    l->device = (long long)self.st_dev;
    l->inode = (long long)self.st_ino;
    DIR *dir = fdopendir(fd);
    if (dir == NULL) {
        int e = errno;
        close(fd);
        return e;
    }
    int err = 0;
    for (;;) {
        errno = 0;
        struct dirent *item = readdir(dir);
        if (item == NULL) {
            err = errno;
            break;
        }
        const char *name = item->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
        if ((err = listing_add(l, name, strlen(name))) != 0) break;
        struct listed *row = &l->rows[l->count - 1];
        if (item->d_type == DT_DIR) row->regular = 2;
        if (item->d_type != DT_REG && item->d_type != DT_UNKNOWN) continue;
        if (!with_stat && item->d_type == DT_REG) {
            row->regular = 1;
            continue;
        }
        struct stat st;
        if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        row->regular = 1;
        row->size = (long long)st.st_size;
        row->mtime_ns = ns_of(st.st_mtim);
        row->inode = (long long)st.st_ino;
        row->ctime_ns = ns_of(st.st_ctim);
    }
    closedir(dir);
    if (err == 0 && l->count > 1) {
        qsort_r(l->rows, l->count, sizeof(struct listed), by_name, l->names);
    }
    return err;
}

/* The directories of one call shared by its threads: each takes the next one not taken. */
typedef struct {
    const char **where;
    listing *ls;
    int *errs;
    Py_ssize_t n, next;
    int with_stat;
    pthread_mutex_t lock;
} listing_job;

static void *listing_worker(void *arg) {
    listing_job *job = arg;
    name_thread("dsnative-list"); /* pool.c */
    for (;;) {
        pthread_mutex_lock(&job->lock);
        Py_ssize_t i = job->next++;
        pthread_mutex_unlock(&job->lock);
        if (i >= job->n) return NULL;
        job->errs[i] = read_listing(job->where[i], &job->ls[i], job->with_stat);
    }
}

/* Every directory read on up to `threads` threads (this one among them); 0, or the errno
 * of the first directory in order that failed, its index in *failed. */
static int read_listings(const char **where, listing *ls, int *errs, Py_ssize_t n, int with_stat, int threads,
                         Py_ssize_t *failed) {
    listing_job job = {where, ls, errs, n, 0, with_stat, PTHREAD_MUTEX_INITIALIZER};
    pthread_t ids[64];
    int started = 0;
    if (threads > 64) threads = 64;
    if ((Py_ssize_t)threads > n) threads = (int)n;
    for (; started < threads - 1; started++)
        if (pthread_create(&ids[started], NULL, listing_worker, &job) != 0) break; /* fewer, then */
    listing_worker(&job);
    for (int k = 0; k < started; k++) pthread_join(ids[k], NULL);
    pthread_mutex_destroy(&job.lock);
    for (Py_ssize_t i = 0; i < n; i++)
        if (errs[i] != 0) {
            *failed = i;
            return errs[i];
        }
    return 0;
}

/* `head` + `name` decoded as os.fsdecode does (scratch grows as needed). */
static PyObject *joined(const char *head, size_t head_length, const char *name, size_t length, char **scratch,
                        size_t *cap) {
    if (head_length + length > *cap) {
        size_t grown = (head_length + length) * 2;
        char *bigger = PyMem_Realloc(*scratch, grown);
        if (bigger == NULL) return PyErr_NoMemory();
        *scratch = bigger;
        *cap = grown;
    }
    memcpy(*scratch, head, head_length);
    memcpy(*scratch + head_length, name, length);
    return PyUnicode_DecodeFSDefaultAndSize(*scratch, (Py_ssize_t)(head_length + length));
}

/* One directory's result tuple (see the top of this file); NULL with an error set. */
static PyObject *listing_result(const listing *l, PyObject *prefix, char **scratch, size_t *scratch_cap) {
    PyObject *paths = NULL, *stats = NULL, *dirs = NULL, *others = NULL, *result = NULL;
    size_t files = 0;
    for (size_t i = 0; i < l->count; i++) files += l->rows[i].regular == 1;
    paths = PyList_New((Py_ssize_t)files);
    stats = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(files * 4 * sizeof(long long)));
    dirs = PyList_New(0);
    others = PyList_New(0);
    if (paths == NULL || stats == NULL || dirs == NULL || others == NULL) goto done;
    long long *numbers = (long long *)PyBytes_AS_STRING(stats);
    const char *head = PyBytes_AS_STRING(prefix);
    size_t head_length = (size_t)PyBytes_GET_SIZE(prefix), k = 0;
    for (size_t i = 0; i < l->count; i++) {
        const struct listed *row = &l->rows[i];
        const char *name = l->names + row->name;
        if (row->regular != 1) {
            PyObject *decoded = PyUnicode_DecodeFSDefaultAndSize(name, (Py_ssize_t)row->length);
            if (decoded == NULL || PyList_Append(row->regular == 2 ? dirs : others, decoded) != 0) {
                Py_XDECREF(decoded);
                goto done;
            }
            Py_DECREF(decoded);
            continue;
        }
        PyObject *relative = joined(head, head_length, name, row->length, scratch, scratch_cap);
        if (relative == NULL) goto done;
        PyList_SET_ITEM(paths, (Py_ssize_t)k, relative);
        numbers[4 * k] = row->size;
        numbers[4 * k + 1] = row->mtime_ns;
        numbers[4 * k + 2] = row->inode;
        numbers[4 * k + 3] = row->ctime_ns;
        k++;
    }
    result = Py_BuildValue("(OOOOnLL)", paths, stats, dirs, others, (Py_ssize_t)l->count, l->device, l->inode);
done:
    Py_XDECREF(paths);
    Py_XDECREF(stats);
    Py_XDECREF(dirs);
    Py_XDECREF(others);
    return result;
}

static PyObject *list_dirs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths_arg, *prefixes_arg;
    int with_stat = 1, threads = 1;
    if (!PyArg_ParseTuple(args, "O!O!|pi", &PyList_Type, &paths_arg, &PyList_Type, &prefixes_arg, &with_stat, &threads))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths_arg);
    if (PyList_GET_SIZE(prefixes_arg) != n) {
        PyErr_SetString(PyExc_ValueError, "one prefix a directory");
        return NULL;
    }
    PyObject **encoded = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *) * 2);
    int *errs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(int));
    listing *ls = PyMem_Calloc(n ? (size_t)n : 1, sizeof(listing));
    const char **where = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    PyObject *results = NULL;
    char *scratch = NULL;
    size_t scratch_cap = 0;
    if (encoded == NULL || ls == NULL || where == NULL || errs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths_arg, i), &encoded[2 * i]) ||
            !PyUnicode_FSConverter(PyList_GET_ITEM(prefixes_arg, i), &encoded[2 * i + 1]))
            goto done;
        where[i] = PyBytes_AS_STRING(encoded[2 * i]);
    }
    int err = 0;
    Py_ssize_t failed = -1;
    Py_BEGIN_ALLOW_THREADS
    if (threads > 1 && n > 1) {
        err = read_listings(where, ls, errs, n, with_stat, threads, &failed);
    } else {
        for (Py_ssize_t i = 0; i < n && err == 0; i++) {
            err = read_listing(where[i], &ls[i], with_stat);
            if (err) failed = i;
        }
    }
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PyList_GET_ITEM(paths_arg, failed));
        goto done;
    }
    results = PyList_New(n);
    if (results == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *one = listing_result(&ls[i], encoded[2 * i + 1], &scratch, &scratch_cap);
        if (one == NULL) {
            Py_CLEAR(results);
            goto done;
        }
        PyList_SET_ITEM(results, i, one);
    }
done:
    for (Py_ssize_t i = 0; encoded != NULL && i < 2 * n; i++) Py_XDECREF(encoded[i]);
    for (Py_ssize_t i = 0; ls != NULL && i < n; i++) {
        free(ls[i].names);
        free(ls[i].rows);
    }
    PyMem_Free(encoded);
    PyMem_Free(errs);
    PyMem_Free(ls);
    PyMem_Free(where);
    PyMem_Free(scratch);
    return results;
}
