#!/usr/bin/env bash
# Creates the etcd user and role that limit mizar-apiserver to its own keys.
# mizar-apiserver authenticates to etcd with a TLS client certificate whose
# CN is the user name (etcd --client-cert-auth maps CN to the user), so the
# user has no password. Run once with root credentials, e.g.:
#   ETCDCTL_ENDPOINTS=https://etcd:2379 ETCDCTL_CACERT=ca.crt \
#   ETCDCTL_CERT=root.crt ETCDCTL_KEY=root.key artifacts/etcd/mizar-role.sh
#
# Prefixes: /registry/mizar/ holds the API objects (the apiserver's
# --etcd-prefix), /mizar/locks/ the create locks. Keep them in step with
# pkg/apiserver/options.go. The apiserver's periodic compaction needs no extra
# permission; a shared etcd usually leaves compaction to its operator: pass
# --etcd-compaction-interval=0 then.
set -o errexit -o nounset -o pipefail

USER=${MIZAR_ETCD_USER:-mizar-apiserver}
ROLE=${MIZAR_ETCD_ROLE:-mizar}

etcdctl role get "$ROLE" >/dev/null 2>&1 || etcdctl role add "$ROLE"
etcdctl role grant-permission "$ROLE" --prefix=true readwrite /registry/mizar/
etcdctl role grant-permission "$ROLE" --prefix=true readwrite /mizar/locks/
etcdctl user get "$USER" >/dev/null 2>&1 || etcdctl user add "$USER" --no-password
etcdctl user grant-role "$USER" "$ROLE"
etcdctl role get "$ROLE"
