/* Which blocks of a pack buffer are worth compressing (included by dsnative.c).
 *
 * compressible_blocks(buffer, block, pieces, piece, nlogn, num, den) -> bytes
 *
 * One byte a block of `block` bytes of `buffer` (the last one shorter): 1 where the
 * block's sample would shrink below num/den of its size coded by its own byte
 * frequencies, 0 where it would not (the block is then stored raw). The sample is
 * `pieces` pieces of `piece` bytes spread evenly over the block (the first at its start,
 * the last at its end), or the whole block when it is no longer than that. Its order-0
 * size, in 1/65536 bits, is nlogn[n] - sum(nlogn[count]) over the byte values, n the
 * sample's length and nlogn the int64 table of c * log2(c) * 65536 rounded (c from 0 to
 * pieces * piece) that dsagent.format.frames makes: integers only, so this and the
 * Python rule there decide every block alike. The GIL is released while it counts.
 */

static PyObject *compressible_blocks(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, table;
    Py_ssize_t block, pieces, piece;
    long long num, den;
    if (!PyArg_ParseTuple(args, "y*nnny*LL", &data, &block, &pieces, &piece, &table, &num, &den)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t most = pieces * piece;
    if (block <= 0 || pieces < 2 || piece <= 0 || most > (1 << 20) || num <= 0 || den <= 0 ||
        table.len != (Py_ssize_t)sizeof(long long) * (most + 1)) {
        PyErr_SetString(PyExc_ValueError, "a positive block, two pieces or more, and one table entry a count");
        goto done;
    }
    Py_ssize_t blocks = (data.len + block - 1) / block;
    out = PyBytes_FromStringAndSize(NULL, blocks);
    if (out == NULL) goto done;
    unsigned char *verdict = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *bytes = data.buf;
    const long long *nlogn = table.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const unsigned char *at = bytes + b * block;
        Py_ssize_t length = data.len - b * block < block ? data.len - b * block : block;
        unsigned int counts[256] = {0};
        Py_ssize_t n;
        if (length <= most) {
            for (Py_ssize_t k = 0; k < length; k++) counts[at[k]]++;
            n = length;
        } else {
            Py_ssize_t step = (length - piece) / (pieces - 1);
            for (Py_ssize_t i = 0; i < pieces; i++)
                for (Py_ssize_t k = 0; k < piece; k++) counts[at[i * step + k]]++;
            n = most;
        }
        long long bits = nlogn[n];
        for (int v = 0; v < 256; v++) bits -= nlogn[counts[v]];
        verdict[b] = bits * den < num * 8 * (long long)n * 65536;
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&table);
    return out;
}
