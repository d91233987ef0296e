/* A dataset's layout checks (included by dsnative.c): dsagent.format.entries.check_layout's
 * two passes over every path, in C.
 *
 * first_unsafe(paths) -> int
 *
 * The index of the first path of the list that is not a clean relative POSIX path, or -1.
 * Unsafe: one of its '/'-separated components is empty (an empty path, a leading,
 * doubled or trailing '/'), "." or "..", or it holds a NUL. The rule of
 * entries._first_unsafe, on code points, so a path of any kind (surrogates too) is read
 * as Python reads it.
 *
 * parents(paths) -> set[str]
 *
 * The parent directory of each path ("" at the top), as {p.rpartition("/")[0] for p in
 * paths}. Paths come sorted, so neighbours mostly share a parent: a string is made only
 * where a path's parent differs from the one before it.
 */

/* The last '/' of `path` (code points), or -1. */
static Py_ssize_t last_slash(PyObject *path) {
    return PyUnicode_FindChar(path, '/', 0, PyUnicode_GET_LENGTH(path), -1);
}

static int unsafe_component(int kind, const void *data, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t length = end - start;
    if (length == 0) return 1;
    if (PyUnicode_READ(kind, data, start) != '.') return 0;
    return length == 1 || (length == 2 && PyUnicode_READ(kind, data, start + 1) == '.');
}

static int unsafe_path(PyObject *path) {
    int kind = PyUnicode_KIND(path);
    const void *data = PyUnicode_DATA(path);
    Py_ssize_t length = PyUnicode_GET_LENGTH(path), start = 0;
    if (kind == PyUnicode_1BYTE_KIND) { /* the common case: memchr for NUL and '/' */
        const unsigned char *bytes = data;
        if (length > 0 && memchr(bytes, 0, (size_t)length) != NULL) return 1;
        for (;;) {
            const unsigned char *slash = memchr(bytes + start, '/', (size_t)(length - start));
            Py_ssize_t end = slash != NULL ? slash - bytes : length;
            if (unsafe_component(kind, data, start, end)) return 1;
            if (slash == NULL) return 0;
            start = end + 1;
        }
    }
    for (Py_ssize_t at = 0; at <= length; at++) {
        Py_UCS4 c = at < length ? PyUnicode_READ(kind, data, at) : '/';
        if (c == 0) return 1;
        if (c != '/') continue;
        if (unsafe_component(kind, data, start, at)) return 1;
        start = at + 1;
    }
    return 0;
}

static PyObject *first_unsafe(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *paths = PySequence_Fast(arg, "first_unsafe: a sequence of paths");
    if (paths == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(paths), found = -1;
    PyObject **items = PySequence_Fast_ITEMS(paths);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "first_unsafe: paths are str");
            Py_DECREF(paths);
            return NULL;
        }
        if (unsafe_path(items[i])) {
            found = i;
            break;
        }
    }
    Py_DECREF(paths);
    return PyLong_FromSsize_t(found);
}

/* Whether `path`'s first `length` code points are `parent`. */
static int same_parent(PyObject *parent, PyObject *path, Py_ssize_t length) {
    if (PyUnicode_GET_LENGTH(parent) != length) return 0;
    if (PyUnicode_KIND(parent) != PyUnicode_KIND(path)) return 0;
    return memcmp(PyUnicode_DATA(parent), PyUnicode_DATA(path), (size_t)length * PyUnicode_KIND(path)) == 0;
}

static PyObject *parents(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *paths = PySequence_Fast(arg, "parents: a sequence of paths");
    if (paths == NULL) return NULL;
    PyObject *found = PySet_New(NULL), *last = NULL;
    if (found == NULL) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(paths);
    PyObject **items = PySequence_Fast_ITEMS(paths);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = items[i];
        if (!PyUnicode_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "parents: paths are str");
            goto fail;
        }
        Py_ssize_t slash = last_slash(path);
        if (slash == -2) goto fail;
        Py_ssize_t length = slash < 0 ? 0 : slash;
        if (last != NULL && same_parent(last, path, length)) continue;
        Py_XDECREF(last);
        last = PyUnicode_Substring(path, 0, length);
        if (last == NULL || PySet_Add(found, last) < 0) goto fail;
    }
    Py_XDECREF(last);
    Py_DECREF(paths);
    return found;
fail:
    Py_XDECREF(last);
    Py_XDECREF(found);
    Py_DECREF(paths);
    return NULL;
}
