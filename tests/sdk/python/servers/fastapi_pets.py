"""A small real web service written with FastAPI, whose own OpenAPI 3.1 document an `openapi`
source imports: nested pydantic models (`$defs` once imported), Optional fields (`anyOf` with
`null`), an array in the query, a header parameter, a form body, path parameters that need
percent-encoding (one a `{key:path}` route), JSON bodies (one whose model has distinct
Input and Output schemas), a 404 with a detail, and an API key
in a header (`components.securitySchemes`).

`app(key)` builds it; every request it gets is recorded raw (method, path as sent, query
string, headers, body) in `app.state.seen`, so a test asserts what the service received."""

# No `from __future__ import annotations`: FastAPI reads the annotations of the closures below.

from enum import Enum
from typing import Annotated

from fastapi import Depends, FastAPI, Form, Header, HTTPException, Query, Security
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, Field, computed_field


class Kind(str, Enum):
    cat = "cat"
    dog = "dog"
    bird = "bird"


class Address(BaseModel):
    street: str
    city: str
    postcode: str | None = None


class Owner(BaseModel):
    name: str
    email: str | None = None
    address: Address


class PetIn(BaseModel):
    name: str = Field(min_length=1, max_length=40)
    kind: Kind
    tags: list[str] = []
    owner: Owner | None = None


class Pet(PetIn):
    id: int


class PetList(BaseModel):
    pets: list[Pet]
    count: int


class Note(BaseModel):
    pet_id: int
    text: str
    rating: int
    labels: list[str]


class FileInfo(BaseModel):
    name: str
    length: int


class Label(BaseModel):
    """In a request and in an answer: FastAPI names its two schemas `Label-Input` and
    `Label-Output` (the computed field is only in the answer)."""

    text: str

    @computed_field
    @property
    def upper(self) -> str:
        return self.text.upper()


class Recorder:
    """ASGI middleware keeping each request as it arrived, before FastAPI decodes it."""

    def __init__(self, app, seen: list):
        self.inner, self.seen = app, seen

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        body = bytearray()

        async def recording():
            message = await receive()
            body.extend(message.get("body", b""))
            return message

        entry = {
            "method": scope["method"],
            "raw_path": scope["raw_path"].decode("latin-1"),
            "query": scope["query_string"].decode("latin-1"),
            "headers": {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
        }
        try:
            await self.inner(scope, recording, send)
        finally:
            entry["body"] = bytes(body).decode("utf-8", "replace")
            if entry["raw_path"] != "/openapi.json":
                self.seen.append(entry)


def app(key: str) -> FastAPI:
    api_key = APIKeyHeader(name="X-API-Key")

    def checked(given: Annotated[str, Security(api_key)]) -> None:
        if given != key:
            raise HTTPException(status_code=403, detail="wrong API key")

    api = FastAPI(title="pets", version="1.0.0", dependencies=[Depends(checked)])
    pets: dict[int, Pet] = {}

    @api.get("/pets", operation_id="listPets", summary="List pets, by tag")
    def list_pets(
        tag: Annotated[list[str], Query(description="Pets with any of these tags")] = [],  # noqa: B006
        limit: int | None = None,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> PetList:
        found = [p for p in pets.values() if not tag or set(tag) & set(p.tags)]
        found = found[:limit] if limit is not None else found
        return PetList(pets=found, count=len(found))

    @api.post("/pets", operation_id="createPet", status_code=201)
    def create_pet(pet: PetIn) -> Pet:
        created = Pet(id=len(pets) + 1, **pet.model_dump())
        pets[created.id] = created
        return created

    @api.get("/pets/{pet_id}", operation_id="getPet")
    def get_pet(pet_id: int) -> Pet:
        if pet_id not in pets:
            raise HTTPException(status_code=404, detail=f"no pet {pet_id}")
        return pets[pet_id]

    @api.delete("/pets/{pet_id}", operation_id="deletePet", status_code=204)
    def delete_pet(pet_id: int) -> None:
        if pets.pop(pet_id, None) is None:
            raise HTTPException(status_code=404, detail=f"no pet {pet_id}")

    @api.post("/pets/{pet_id}/notes", operation_id="addNote")
    def add_note(
        pet_id: int,
        text: Annotated[str, Form()],
        rating: Annotated[int, Form(ge=1, le=5)],
        labels: Annotated[list[str], Form()] = [],  # noqa: B006
    ) -> Note:
        if pet_id not in pets:
            raise HTTPException(status_code=404, detail=f"no pet {pet_id}")
        return Note(pet_id=pet_id, text=text, rating=rating, labels=labels)

    @api.get("/files/{name}", operation_id="getFile")
    def get_file(name: str) -> FileInfo:
        return FileInfo(name=name, length=len(name))

    @api.get("/blobs/{key:path}", operation_id="getBlob")
    def get_blob(key: str) -> FileInfo:
        return FileInfo(name=key, length=len(key))

    @api.put("/labels/{label_id}", operation_id="putLabel")
    def put_label(label_id: int, label: Label) -> Label:
        return label

    seen: list = []
    api.state.seen = seen
    api.add_middleware(Recorder, seen=seen)
    return api
