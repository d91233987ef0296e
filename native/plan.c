/* The bundle plan's boundaries (included by dsnative.c).
 *
 * plan_cuts(paths, upto, max_files, max_bytes) -> list[int] | None
 *
 * dsagent.format.bundles.bundle.plan_bundles's scheme, in C: each gap between neighbouring paths
 * gets the priority xxh3-64 of the UTF-8 path before it; a gap's domain is the run of
 * entries between the nearest gaps of smaller priority on either side (ties: the one on
 * the left counts as smaller); a gap is a cut when its domain holds more than max_files
 * files or more than max_bytes bytes (upto: the bytes before each entry, n + 1 sums). The
 * cut gaps come back in order, the same list as the Python loop's. None when a path is not
 * plain UTF-8 (it holds surrogates: the Python loop hashes the bytes it stands for).
 */

static PyObject *plan_cuts(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths, *upto;
    long long max_files, max_bytes;
    if (!PyArg_ParseTuple(args, "O!O!LL", &PyList_Type, &paths, &PyList_Type, &upto, &max_files, &max_bytes))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(upto) != n + 1) {
        PyErr_SetString(PyExc_ValueError, "plan_cuts: upto holds n + 1 sums");
        return NULL;
    }
    Py_ssize_t gaps = n > 0 ? n - 1 : 0;
    uint64_t *priority = PyMem_Malloc((gaps ? gaps : 1) * sizeof(uint64_t));
    Py_ssize_t *left = PyMem_Malloc((gaps ? gaps : 1) * sizeof(Py_ssize_t));
    Py_ssize_t *right = PyMem_Malloc((gaps ? gaps : 1) * sizeof(Py_ssize_t));
    Py_ssize_t *stack = PyMem_Malloc((gaps ? gaps : 1) * sizeof(Py_ssize_t));
    long long *sums = PyMem_Malloc((size_t)(n + 1) * sizeof(long long));
    PyObject *result = NULL;
    if (priority == NULL || left == NULL || right == NULL || stack == NULL || sums == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i <= n; i++) {
        sums[i] = PyLong_AsLongLong(PyList_GET_ITEM(upto, i));
        if (sums[i] == -1 && PyErr_Occurred()) goto done;
    }
    for (Py_ssize_t g = 0; g < gaps; g++) {
        PyObject *path = PyList_GET_ITEM(paths, g);
        Py_ssize_t length;
        const char *raw = PyUnicode_Check(path) ? PyUnicode_AsUTF8AndSize(path, &length) : NULL;
        if (raw == NULL) { /* surrogates (or not a str): the Python loop's */
            PyErr_Clear();
            result = Py_NewRef(Py_None);
            goto done;
        }
        priority[g] = xxh3_64_oneshot(raw, (size_t)length);
    }
    Py_ssize_t depth = 0;
    for (Py_ssize_t g = 0; g < gaps; g++) {
        left[g] = -1;
        right[g] = n - 1;
    }
    for (Py_ssize_t g = 0; g < gaps; g++) {
        while (depth > 0 && priority[stack[depth - 1]] > priority[g]) right[stack[--depth]] = g;
        if (depth > 0) left[g] = stack[depth - 1];
        stack[depth++] = g;
    }
    result = PyList_New(0);
    if (result == NULL) goto done;
    for (Py_ssize_t g = 0; g < gaps; g++) {
        if (right[g] - left[g] > max_files || sums[right[g] + 1] - sums[left[g] + 1] > max_bytes) {
            PyObject *cut = PyLong_FromSsize_t(g);
            if (cut == NULL || PyList_Append(result, cut) != 0) {
                Py_XDECREF(cut);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(cut);
        }
    }
done:
    PyMem_Free(priority);
    PyMem_Free(left);
    PyMem_Free(right);
    PyMem_Free(stack);
    PyMem_Free(sums);
    return result;
}
