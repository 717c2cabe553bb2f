#!/usr/bin/env bash
# Creates a TEST public-key infrastructure and token file for ckptd with the openssl CLI:
#
#   deploy/make-test-pki.sh DIR [SERVER_NAME...]
#
# writes into DIR (created; existing files are overwritten):
#   ca.pem, ca.key              a self-signed test CA (valid 30 days)
#   server.pem, server.key      ckptd's certificate, for localhost, 127.0.0.1 and SERVER_NAMEs
#                               (names, or IPv4 addresses)
#   client.pem, client.key      a client certificate with CN=operator (mutual TLS)
#   admin.token, writer.token, reader.token
#                               one random bearer token each (the secrets: give them to clients)
#   tokens.txt                  ckptd's --auth-tokens file: principals admin, writer, reader with
#                               the SHA-256 of their token, and "operator admin cert" for the
#                               client certificate
#
# Then:
#   ckptd --tls-cert DIR/server.pem --tls-key DIR/server.key --auth-tokens DIR/tokens.txt
#         [--tls-client-ca DIR/ca.pem]
#   ckptctl --tls-ca DIR/ca.pem --token-file DIR/writer.token ls
#         [--tls-cert DIR/client.pem --tls-key DIR/client.key]
#
# For tests and demos only: a production CA keeps its key offline and issues longer-lived,
# revocable certificates.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [SERVER_NAME...]" >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ $name =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
    san="$san,IP:$name"
  else
    san="$san,DNS:$name"
  fi
done

# Runs an openssl command quietly, showing its output only when it fails.
run() {
  local out
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out" >&2
    return 1
  fi
}

# The CA.
run openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 30 -subj "/CN=ckptd test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue NAME CN EXTENSIONS: a key and a certificate signed by the CA.
issue() {
  local name=$1 cn=$2 ext=$3
  run openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$cn"
  printf '%s\n' "$ext" >"$dir/$name.ext"
  run openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$name.pem" -days 30 -extfile "$dir/$name.ext"
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}
issue server ckptd "subjectAltName=$san
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE"
issue client operator "extendedKeyUsage=clientAuth
basicConstraints=CA:FALSE"
rm -f "$dir/ca.srl"

# Tokens: 32 random bytes as hex; the file ckptd reads holds only their SHA-256.
{
  echo "# ckptd principals: NAME ROLE SHA256HEX-of-token, or NAME ROLE cert (mutual TLS CN)"
  for role in admin writer reader; do
    openssl rand -hex 32 >"$dir/$role.token"
    hash=$(tr -d '\n' <"$dir/$role.token" | openssl dgst -sha256 -r | cut -d' ' -f1)
    echo "$role $role $hash"
  done
  echo "operator admin cert"
} >"$dir/tokens.txt"
chmod 644 "$dir/ca.pem" "$dir/server.pem" "$dir/client.pem" "$dir/tokens.txt"
echo "wrote a test CA, server and client certificates and tokens into $dir"
