#!/bin/sh
# The webhook's serving certificate for deploy/kustomize (namespace datacache-system, release "dc"):
# a CA (ca.crt) and a certificate for the webhook Service's DNS name signed by it (tls.crt,
# tls.key), 10 years, as the chart's genCA/genSignedCert make them. Writes into this directory.
set -eu
cd "$(dirname "$0")"
service=dc-datacache-webhook.datacache-system.svc
umask 077
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=dc-datacache-ca -keyout ca.key -out ca.crt 2>/dev/null
printf 'subjectAltName=DNS:dc-datacache-webhook,DNS:dc-datacache-webhook.datacache-system,DNS:%s\n' "$service" > san.ext
openssl req -newkey rsa:2048 -nodes -subj "/CN=$service" -keyout tls.key -out tls.csr 2>/dev/null
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile san.ext -out tls.crt 2>/dev/null
rm -f tls.csr san.ext ca.srl ca.key
echo "wrote $(pwd)/ca.crt, tls.crt, tls.key"
