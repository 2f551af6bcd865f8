/* hello.c -- store a chunk through the pool and read it back, zero-copy.
 * Build: cc hello.c $(pkg-config --cflags --libs kvtier) */
#include <kvtier.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    kvt_client *c;
    kvt_err e = kvt_connect(argc > 1 ? argv[1] : NULL, &c); /* $KVTIER_SOCKET */
    if (e) return fprintf(stderr, "connect: %s\n", kvt_strerror(e)), 1;

    uint32_t tokens[512];                      /* a 512-token prompt ... */
    for (int i = 0; i < 512; i++) tokens[i] = (uint32_t)i * 7;
    kvt_hash_params hp = {.scheme = KVT_SCHEME_KVT1, .chunk_tokens = 256,
                          .ns = "demo/llama-3-8b/bf16"};
    kvt_key keys[2];                           /* ... is two chunks of 256 */
    size_t n, sizes[2] = {1 << 20, 1 << 20}, present, got;
    kvt_hash_chain(&hp, tokens, 512, keys, 2, &n);

    kvt_chunk ch[2];
    kvt_lease lease;
    e = kvt_put_begin(c, hp.ns, keys, sizes, 2, NULL, &lease, ch);
    for (int i = 0; !e && i < 2; i++)          /* write KV straight into the pool */
        if (!ch[i].exists) memset(ch[i].data, 'A' + i, ch[i].size);
    if (!e) e = kvt_put_commit(c, lease, ch, 2, NULL);
    if (!e) e = kvt_lookup(c, hp.ns, keys, 2, &present, NULL);
    if (!e) e = kvt_get(c, hp.ns, keys, 2, &lease, ch, &got);
    if (e) return fprintf(stderr, "%s: %s\n", kvt_strerror(e), kvt_last_error(c)), 1;
    printf("%zu of 2 chunks cached; first byte of chunk 1: %c\n", present,
           ((const char *)ch[1].data)[0]);
    kvt_release(c, lease);
    kvt_close(c);
    return 0;
}
