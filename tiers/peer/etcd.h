/*
 * etcd.h -- the etcd membership backend (see etcd.c). Use it through
 * member.h, with cfg.service_url (comma-separated http://host:port),
 * cfg.service_prefix and cfg.lease_ms set:
 *
 *     struct mb *mb = mb_create(&etcd_ops, &cfg, &why);
 *     mb_join(mb, NULL, 0);   registers and starts watching
 */
#ifndef KVT_ETCD_H
#define KVT_ETCD_H

#include "member.h"

extern const struct mb_ops etcd_ops;

/* 1 while registered and watching; the last error otherwise (err may be
 * NULL). Owning thread only. */
int etcd_up(struct mb *mb, char *err, size_t errlen);

/* The value a member registers under prefix<id>: its incarnation, whether
 * it is leaving, its address and metadata. Exposed for tests (a hostile
 * value must be refused): etcd_value_parse returns 0 or -1. */
size_t etcd_value_make(char *out, size_t cap, uint64_t inc, int left, const char *addr,
                       const uint8_t *meta, size_t meta_len);
int etcd_value_parse(const uint8_t *v, size_t len, uint64_t *inc, int *left, char *addr,
                     uint8_t *meta, size_t *meta_len);

#endif
