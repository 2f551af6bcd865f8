#!/usr/bin/env bash
# mkcerts.sh DIR [MAX_ID] -- the certificates the cluster tests and benches
# use, made with the openssl CLI:
#   DIR/ca.crt                      the cluster's CA
#   DIR/node-N.{crt,key}            N = 1..MAX_ID (8): CN and DNS name
#                                   kvtier-node-N, signed by ca
#   DIR/foreign-ca.crt              another CA
#   DIR/foreign-N.{crt,key}         N = 1..MAX_ID: kvtier-node-N signed by
#                                   foreign-ca (right name, wrong CA)
#   DIR/expired-N.{crt,key}         N = 1..MAX_ID: signed by ca, valid only
#                                   in 2020
set -eu
dir=$1 max=${2:-8}
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { # name
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 3650 -subj "/CN=kvtier test $1" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
# openssl ca can back-date a certificate; x509 -req cannot (OpenSSL 3.0).
conf() { # ca
    mkdir -p "db-$1"; : > "db-$1/index.txt"; [ -f "db-$1/serial" ] || echo 1000 > "db-$1/serial"
    cat > "db-$1/ca.cnf" <<CNF
[ca]
default_ca = d
[d]
database = db-$1/index.txt
serial = db-$1/serial
new_certs_dir = db-$1
certificate = $1.crt
private_key = $1.key
default_md = sha256
policy = p
unique_subject = no
copy_extensions = none
[p]
commonName = supplied
[ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = \$ENV::SAN
CNF
}
sign() { # ca out id start end
    key "$2.key"
    openssl req -new -key "$2.key" -out "$2.csr" -subj "/CN=kvtier-node-$3" 2>/dev/null
    SAN="DNS:kvtier-node-$3" openssl ca -batch -notext -config "db-$1/ca.cnf" -extensions ext \
        -startdate "$4" -enddate "$5" -in "$2.csr" -out "$2.crt" 2>/dev/null
    rm -f "$2.csr"
}
ca ca; ca foreign-ca
conf ca; conf foreign-ca
for n in $(seq 1 "$max"); do
    sign ca "node-$n" "$n" 20200101000000Z 20991231000000Z
    sign foreign-ca "foreign-$n" "$n" 20200101000000Z 20991231000000Z
    sign ca "expired-$n" "$n" 20200101000000Z 20200201000000Z
done
rm -rf db-ca db-foreign-ca
