/* The ready check's look at the disk (included by dsnative.c).
 *
 * sized_files(root, paths, sizes, start, stop) -> list[int]
 *
 * The indexes i in [start, stop) for which root/paths[i] is not a regular file of
 * sizes[i] bytes: missing, not a regular file (a symlink is not followed, as lstat),
 * another size, or any error of its lstat. `sizes` is a buffer of 64-bit unsigned ints (the
 * manifest table's array("Q")), one a path. What dsagent.cache.ready.incomplete's loop finds,
 * with the GIL released for the whole loop (an lstat a file, no read); the caller words
 * the problems from the indexes, so both paths give the same messages. The paths of the
 * range are copied into a list this call owns, and encoded as os.fsencode does, before
 * the GIL is released. Opening `root` fails as OSError with its path.
 */

static PyObject *sized_files(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *root_arg, *paths_arg, *root = NULL, *own = NULL, **encoded = NULL, *result = NULL;
    Py_buffer sizes = {0};
    Py_ssize_t start, stop;
    long long *bad = NULL;
    if (!PyArg_ParseTuple(args, "OO!y*nn", &root_arg, &PyList_Type, &paths_arg, &sizes, &start, &stop)) return NULL;
    Py_ssize_t total = PyList_GET_SIZE(paths_arg);
    if (sizes.itemsize != 8 || sizes.len != total * 8) {
        PyErr_SetString(PyExc_ValueError, "sized_files: one 64-bit size a path");
        goto done;
    }
    if (start < 0 || stop > total || start > stop) {
        PyErr_SetString(PyExc_ValueError, "sized_files: start and stop out of range");
        goto done;
    }
    if (!PyUnicode_FSConverter(root_arg, &root)) goto done;
    own = PyList_GetSlice(paths_arg, start, stop);
    if (own == NULL) goto done;
    Py_ssize_t n = stop - start;
    encoded = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
    bad = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(long long));
    if (encoded == NULL || bad == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(own, i), &encoded[i])) goto done;
    const uint64_t *want = (const uint64_t *)sizes.buf + start;
    const char *where = PyBytes_AS_STRING(root);
    Py_ssize_t found = 0;
    int fd, err = 0;
    Py_BEGIN_ALLOW_THREADS
    fd = open(where, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
    } else {
        struct stat st;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (fstatat(fd, PyBytes_AS_STRING(encoded[i]), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
                (uint64_t)st.st_size != want[i])
                bad[found++] = (long long)(start + i);
        }
        close(fd);
    }
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, root_arg);
        goto done;
    }
    result = PyList_New(found);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < found; i++) {
        PyObject *index = PyLong_FromLongLong(bad[i]);
        if (index == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, index);
    }
done:
    for (Py_ssize_t i = 0; encoded != NULL && own != NULL && i < PyList_GET_SIZE(own); i++) Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(bad);
    Py_XDECREF(own);
    Py_XDECREF(root);
    PyBuffer_Release(&sizes);
    return result;
}
