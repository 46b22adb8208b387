// The API explorer at /docs: Swagger UI from this server's own files, started here because the page's
// Content-Security-Policy allows no inline script. Paths are relative so that a path prefix in front of the
// server keeps working.
"use strict";

window.ui = window.SwaggerUIBundle({
  url: new URL("openapi.json", document.baseURI).href,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // Swagger UI would otherwise send the document to validator.swagger.io
  presets: [window.SwaggerUIBundle.presets.apis, window.SwaggerUIBundle.SwaggerUIStandalonePreset],
});
