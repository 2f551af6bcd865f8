"""kvtier: the Python client of the kvtier KV-cache daemon.

`kvtier.Client` speaks to the kvtierd of this node through libkvtier;
`kvtier.vllm.KVTierConnector` plugs kvtier into vLLM and
`kvtier.sglang.KVTierStore` into SGLang's HiCache.
"""
from .client import (Client, Err, GetLease, KVTierError, PutLease, Scheme, Tier,
                     checksum, hash_chain, key_bytes, key_hex)

__version__ = "0.1.0"
__all__ = ["Client", "Err", "GetLease", "KVTierError", "PutLease", "Scheme",
           "Tier", "checksum", "hash_chain", "key_bytes", "key_hex"]
