// Polls a page's live fragment with If-None-Match while its workflow runs;
// the server answers 304 when nothing changed, so idle tabs cost little.
(function () {
  "use strict";
  var box = document.getElementById("live");
  if (!box) { return; }
  var etag = null;
  var delayMs = 1000;
  function poll() {
    var headers = etag ? { "If-None-Match": etag } : {};
    fetch(box.dataset.live, { headers: headers, credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 200) {
          etag = response.headers.get("ETag");
          return response.text().then(function (html) { box.innerHTML = html; });
        }
        return null;
      })
      .catch(function () { return null; })
      .then(function () {
        var state = document.getElementById("state");
        if (state && state.textContent === "RUNNING") { setTimeout(poll, delayMs); }
      });
  }
  if (box.dataset.running === "yes") { setTimeout(poll, delayMs); }
}());
