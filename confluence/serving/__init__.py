"""The prediction service: `confluence serve` (an HTTP JSON API, FastAPI on uvicorn) answering `POST /predict`
with the rows `confluence predict --anchors` writes, requests batched on the device.

`app.create_app(checkpoint, db, ...)` returns the ASGI app; `service.PredictionService` is the same without HTTP;
`batching` merges concurrent requests into shared forward passes. docs/reference/http.md describes the API."""
