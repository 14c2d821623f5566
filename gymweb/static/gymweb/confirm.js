// Forms marked data-confirm="question" ask before they are sent (e.g. Cancel run). A delegated
// listener, so forms that HTMX swaps in later are covered; no inline handler (the CSP forbids them).
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);
})();
