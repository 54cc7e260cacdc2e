"""An MCP server written with the official Python SDK that accepts only access tokens of one
OpenID provider addressed to it: `notes_upstream.py PORT ISSUER AUDIENCE`. Its token
verifier checks the JWT's signature against the provider's published keys (JWKS), its issuer,
lifetime and audience; its tool `whoami` answers with the claims of the token its call came
with, so a test sees whose identity reached it."""

from __future__ import annotations

import json
import sys

import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer

PORT, ISSUER, AUDIENCE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
JWKS = jwt.PyJWKClient(f"{ISSUER}/protocol/openid-connect/certs", cache_keys=True, timeout=10)


class JwksVerifier:
    """Accepts RS256 tokens of ISSUER whose `aud` lists AUDIENCE."""

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = JWKS.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key, algorithms=["RS256"], audience=AUDIENCE, issuer=ISSUER)
        except jwt.PyJWTError as e:
            print(f"refused a token: {e}", file=sys.stderr, flush=True)
            return None
        return AccessToken(
            token=token,
            client_id=claims.get("azp", ""),
            scopes=claims.get("scope", "").split(),
            expires_at=claims.get("exp"),
            subject=claims.get("sub"),
            claims=claims,
        )


server = MCPServer(
    "notes-upstream",
    log_level="WARNING",
    token_verifier=JwksVerifier(),
    auth=AuthSettings(
        issuer_url=ISSUER,
        resource_server_url=f"http://127.0.0.1:{PORT}/mcp",
        validate_token_resource=False,  # the verifier checks the audience itself
    ),
)


@server.tool()
def whoami() -> str:
    """The subject, audience and authorized party of the token this call came with."""
    token = get_access_token()
    claims = (token.claims or {}) if token else {}
    return json.dumps({k: claims.get(k) for k in ("sub", "aud", "azp", "preferred_username")})


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=PORT)
