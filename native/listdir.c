/* The pack's listing of one directory (included by dsnative.c).
 *
 * list_dir(path, prefix, base, found) -> (files, others, entries)
 *
 * Reads the directory `path` and stats its regular files (by d_type, or by the stat where
 * the filesystem gives none), all with the GIL released, then builds one `found` tuple (a
 * tuple subclass of six fields: dsagent.format.walk.Found) a file: prefix + name, base +
 * name, size, mtime ns, inode, ctime ns; in byte order of the names, so that the caller's
 * sort by path is a merge of sorted runs. Every other entry (a directory, a symlink, a
 * FIFO, a file gone or changed into something else between the read and the stat) is
 * returned by name in `others`, for the caller's own rules; `entries` counts every entry
 * but "." and "..". An error opening or reading the directory is raised as OSError with
 * its errno and the path. Names are decoded as os.fsdecode does.
 */
#include <dirent.h>

typedef struct {
    char *names;      /* every name, NUL-terminated, one after the other */
    size_t used, cap; /* bytes of `names` */
    struct listed {
        size_t name; /* offset into names */
        size_t length;
        int regular;
        long long size, mtime_ns, inode, ctime_ns;
    } *rows;
    size_t count, rows_cap;
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
static int read_listing(const char *path, listing *l) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
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
        if (item->d_type != DT_REG && item->d_type != DT_UNKNOWN) continue;
        struct stat st;
        struct listed *row = &l->rows[l->count - 1];
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

static PyObject *found_row(PyTypeObject *found, PyObject *path, PyObject *location, const struct listed *row) {
    PyObject *item = found->tp_alloc(found, 6);
    if (item == NULL) {
        Py_DECREF(path);
        Py_DECREF(location);
        return NULL;
    }
    PyTuple_SET_ITEM(item, 0, path);
    PyTuple_SET_ITEM(item, 1, location);
    PyObject *numbers[4] = {PyLong_FromLongLong(row->size), PyLong_FromLongLong(row->mtime_ns),
                            PyLong_FromLongLong(row->inode), PyLong_FromLongLong(row->ctime_ns)};
    for (int i = 0; i < 4; i++) {
        if (numbers[i] == NULL) { /* the tuple's dealloc drops what was set */
            for (int j = i + 1; j < 4; j++) Py_XDECREF(numbers[j]);
            Py_DECREF(item);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 2 + i, numbers[i]);
    }
    return item;
}

static PyObject *list_dir(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path_arg, *prefix_arg, *base_arg, *found_arg;
    if (!PyArg_ParseTuple(args, "OOOO", &path_arg, &prefix_arg, &base_arg, &found_arg)) return NULL;
    if (!PyType_Check(found_arg) || !PyType_IsSubtype((PyTypeObject *)found_arg, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "found must be a tuple type");
        return NULL;
    }
    PyTypeObject *found = (PyTypeObject *)found_arg;
    PyObject *path = NULL, *prefix = NULL, *base = NULL, *files = NULL, *others = NULL, *result = NULL;
    listing l = {0};
    char *scratch = NULL;
    size_t scratch_cap = 0;
    if (!PyUnicode_FSConverter(path_arg, &path) || !PyUnicode_FSConverter(prefix_arg, &prefix) ||
        !PyUnicode_FSConverter(base_arg, &base))
        goto done;
    const char *where = PyBytes_AS_STRING(path);
    int err;
    Py_BEGIN_ALLOW_THREADS err = read_listing(where, &l);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_arg);
        goto done;
    }
    files = PyList_New(0);
    others = PyList_New(0);
    if (files == NULL || others == NULL) goto done;
    const char *head = PyBytes_AS_STRING(prefix), *at = PyBytes_AS_STRING(base);
    size_t head_length = (size_t)PyBytes_GET_SIZE(prefix), at_length = (size_t)PyBytes_GET_SIZE(base);
    for (size_t i = 0; i < l.count; i++) {
        const struct listed *row = &l.rows[i];
        const char *name = l.names + row->name;
        if (!row->regular) {
            PyObject *decoded = PyUnicode_DecodeFSDefaultAndSize(name, (Py_ssize_t)row->length);
            if (decoded == NULL || PyList_Append(others, decoded) != 0) {
                Py_XDECREF(decoded);
                goto done;
            }
            Py_DECREF(decoded);
            continue;
        }
        PyObject *relative = joined(head, head_length, name, row->length, &scratch, &scratch_cap);
        if (relative == NULL) goto done;
        PyObject *location = joined(at, at_length, name, row->length, &scratch, &scratch_cap);
        if (location == NULL) {
            Py_DECREF(relative);
            goto done;
        }
        PyObject *item = found_row(found, relative, location, row);
        if (item == NULL || PyList_Append(files, item) != 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue("(OOn)", files, others, (Py_ssize_t)l.count);
done:
    Py_XDECREF(path);
    Py_XDECREF(prefix);
    Py_XDECREF(base);
    Py_XDECREF(files);
    Py_XDECREF(others);
    PyMem_Free(scratch);
    free(l.names);
    free(l.rows);
    return result;
}
